"""``es-agents bench idle``: what paused runs and due timers cost a worker.

1. Paused runs. ``--paused`` runs are written to a scratch topic, each paused at an
   approval gate, and projected. A worker process (``es-agents worker``, as users
   run it) is started on that topic and on an empty one: its resident memory once
   it owns its partitions and has settled, and the CPU it uses over ``--idle``
   seconds of doing nothing. Paused runs are rows: both should be flat.
2. Timers. ``--timers`` timers due at a steady ``--rate`` per second are scheduled
   through the ``Timers`` port, and fired by the loop a worker runs
   (``Worker.fire_timers``: due timers in batches, their ``fire_timer`` commands
   produced together and acknowledged before the timers are marked). Printed: the
   rate they fired at, and how late after its due time each fired (p50, p99, max).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg

from es_agents.app import build_ports, build_projector
from es_agents.lab.bench import GateLoop, append_paused, scratch_settings, worker_env
from es_agents.runtime.timers import fire_timers
from es_agents.settings import Settings

_TICKS = os.sysconf("SC_CLK_TCK")
gate_loop = GateLoop()  # the runs wait at gate ``g``: the worker's agent
AGENT = "es_agents.lab.bench_idle:gate_loop"


def _worker(settings: Settings, log_dir: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "es_agents.cli", "worker", "--agent", AGENT],
        env=worker_env(settings),
        stdout=subprocess.DEVNULL,
        stderr=(log_dir / f"{settings.kafka.topic_prefix}.log").open("w"),
    )


def _proc(pid: int) -> tuple[float, float]:
    """(CPU seconds, RSS MB) of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / _TICKS
    rss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
    return cpu, rss / 1024


def _idle_worker(
    settings: Settings, paused: int, idle: float, log_dir: Path
) -> dict[str, float]:
    if paused:
        append_paused(settings, paused, 2)
        projector = build_projector(settings, batch_size=5000)
        projector.run(until_caught_up=True, idle_seconds=0.5)
    proc = _worker(settings, log_dir)
    log_file = log_dir / f"{settings.kafka.topic_prefix}.log"
    try:
        deadline = time.monotonic() + 120
        while "assigned" not in log_file.read_text():
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"the worker did not start: see {log_file}")
            time.sleep(0.1)
        time.sleep(3.0)  # resumed what it had to, settled
        cpu0, _ = _proc(proc.pid)
        time.sleep(idle)
        cpu1, rss = _proc(proc.pid)
    finally:
        proc.terminate()
        proc.wait(30)
    return {
        "paused_runs": paused,
        "rss_mb": round(rss, 1),
        "idle_cpu_ms_per_s": round((cpu1 - cpu0) / idle * 1000, 1),
    }


def _timers(settings: Settings, count: int, rate: float) -> dict[str, float]:
    ports = build_ports(settings)
    url = settings.database_url.get_secret_value()
    lead = 3.0  # seconds before the first is due: all scheduled by then
    try:
        start = datetime.now(UTC) + timedelta(seconds=lead)
        rows = [
            (f"t-{n}", f"timer-run-{n % 1000}", start + timedelta(seconds=n / rate))
            for n in range(count)
        ]
        # As ``Timers.schedule`` writes them, in one COPY (the bench's set-up).
        copy = "COPY timers (timer_id, run_id, due_at) FROM STDIN"
        with (
            psycopg.connect(url) as conn,
            conn.cursor() as cur,
            cur.copy(copy) as cp,
        ):
            for row in rows:
                cp.write_row(row)
        last = rows[-1][2]
        fired = 0
        began = time.perf_counter()
        while fired < count:
            n = fire_timers(ports.timers, ports.log)
            fired += n
            if n == 0:
                if datetime.now(UTC) > last + timedelta(seconds=30):
                    raise RuntimeError(f"only {fired} of {count} timers fired")
                time.sleep(0.01)
        took = time.perf_counter() - began - lead
        with psycopg.connect(url) as conn:
            late = [
                float(r[0])
                for r in conn.execute(
                    "SELECT extract(epoch FROM fired_at - due_at) FROM timers"
                )
            ]
    finally:
        ports.close()
    late.sort()
    return {
        "timers": count,
        "due_per_s": rate,
        "fired_per_s": round(count / max(took, 1e-9)),
        "late_ms_p50": round(statistics.median(late) * 1000, 1),
        "late_ms_p99": round(late[int(len(late) * 0.99)] * 1000, 1),
        "late_ms_max": round(late[-1] * 1000, 1),
    }


def bench_idle(
    paused: int, idle: float, timers: int, rate: float, echo: Callable[[str], None]
) -> dict[str, object]:
    log_dir = Path(tempfile.mkdtemp(prefix="es-bench-idle-"))
    with scratch_settings(partitions=4) as empty:
        none = _idle_worker(empty, 0, idle, log_dir)
    echo(
        f"worker with no runs: RSS {none['rss_mb']} MB, idle CPU "
        f"{none['idle_cpu_ms_per_s']} ms/s"
    )
    with scratch_settings(partitions=4) as settings:
        many = _idle_worker(settings, paused, idle, log_dir)
        echo(
            f"worker with {paused:,} paused runs: RSS {many['rss_mb']} MB, idle CPU "
            f"{many['idle_cpu_ms_per_s']} ms/s"
        )
        fired = _timers(settings, timers, rate)
    echo(
        f"{timers:,} timers due at {rate:,.0f}/s: fired at {fired['fired_per_s']:,}/s, "
        f"late by p50 {fired['late_ms_p50']} ms, p99 {fired['late_ms_p99']} ms, "
        f"max {fired['late_ms_max']} ms"
    )
    result: dict[str, object] = {
        "no_runs": none,
        "paused": many,
        "rss_ratio_paused_to_none": round(many["rss_mb"] / none["rss_mb"], 2),
        "timers": fired,
    }
    echo(json.dumps(result))
    return result
