"""CPU seconds by role on this machine, from ``/proc`` (Linux only).

A bench that drives workers also makes the broker, Postgres and the projector work;
on a small machine they share the cores, so steps/s is bounded by the CPU *all* of
them spend per step, not the worker's alone. ``Roles`` samples each role's
processes (user + system time) and the machine's busy time, so a bench can print
CPU per step by role and the ceiling it implies: cores / total CPU per step.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")
_PROC = Path("/proc")

PidFinder = Callable[[], Iterable[int]]


def process_seconds(pid: int) -> float:
    """User + system CPU seconds of one process (0 when it is gone)."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime


def busy_seconds() -> float:
    """CPU seconds the whole machine spent busy (every core, since boot): user,
    nice, system, irq and softirq -- not idle, I/O wait or time a hypervisor stole."""
    first = (_PROC / "stat").read_text().split("\n", 1)[0]
    user, nice, system, _idle, _iowait, irq, softirq = (
        int(v) for v in first.split()[1:8]
    )
    return (user + nice + system + irq + softirq) / _TICKS


def _matching(test: Callable[[str, str], bool]) -> list[int]:
    pids = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if test(comm, cmdline):
            pids.append(int(entry.name))
    return pids


def kafka_brokers() -> list[int]:
    """Local Kafka broker processes (none when the cluster is elsewhere)."""
    return _matching(lambda comm, cmd: comm == "java" and " kafka.Kafka " in cmd)


def postgres() -> list[int]:
    """Local Postgres server processes: the postmaster and every backend."""
    return _matching(lambda comm, cmd: comm == "postgres" or cmd.startswith("postgres"))


class Roles:
    """Samples the CPU seconds of named groups of processes and of the machine."""

    def __init__(self, roles: dict[str, PidFinder]) -> None:
        self.roles = roles
        self._start: dict[str, dict[int, float]] = {}
        self._busy = 0.0

    def start(self) -> None:
        self._start = {
            name: {pid: process_seconds(pid) for pid in find()}
            for name, find in self.roles.items()
        }
        self._busy = busy_seconds()

    def stop(self) -> dict[str, float]:
        """CPU seconds per role since ``start``, and ``machine``: all of it. A
        process that started meanwhile counts from zero."""
        used: dict[str, float] = {}
        for name, find in self.roles.items():
            before = self._start.get(name, {})
            pids = set(find()) | set(before)
            used[name] = sum(
                max(process_seconds(p) - before.get(p, 0.0), 0.0) for p in pids
            )
        used["machine"] = busy_seconds() - self._busy
        return used


def cores() -> int:
    return os.cpu_count() or 1
