"""``es-agents serve``: a worker and a projector kept running by one process.

Each is a child process (``es-agents worker`` and ``es-agents projector``), crash-only
as ever: a child that loses Kafka or Postgres exits (code 4) and the supervisor
starts it again after a backoff that doubles up to ``MAX_BACKOFF`` and resets once
the child has stayed up for ``HEALTHY_AFTER`` seconds. A configuration error (exit 2)
(an agent that does not import, a missing database) stops everything with that
code: restarting would not help. SIGTERM and SIGINT stop the
children cleanly (they leave their groups) and then the supervisor.

The log says one line per change of a child's state (up, down with the reason and
the next try, up again), not one per retry.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

MAX_BACKOFF = 30.0
HEALTHY_AFTER = 30.0  # up this long: the next outage backs off from 1 s again
UP_AFTER = 5.0  # up this long after an outage: said to be back
FATAL = {2: "a configuration error"}  # anything else: crash-only, start it again


@dataclass
class Child:
    """One supervised process: ``argv`` in full (``cli_child`` makes an
    ``es-agents`` one)."""

    name: str
    argv: list[str]
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    backoff: float = 1.0
    next_start: float = 0.0
    restarts: int = 0
    down_since: float | None = None
    exits: list[int] = field(default_factory=list)


def cli_child(name: str, args: Sequence[str]) -> Child:
    return Child(name, [sys.executable, "-m", "es_agents.cli", *args])


class Supervisor:
    def __init__(self, children: Sequence[Child], first_backoff: float = 1.0) -> None:
        self.children = list(children)
        self.first_backoff = first_backoff
        for child in self.children:
            child.backoff = first_backoff
        self._stop = threading.Event()
        self.exit_code = 0

    def stop(self, *_: object) -> None:
        self._stop.set()

    def run(self) -> int:
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self.stop)
            signal.signal(signal.SIGINT, self.stop)
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                for child in self.children:
                    self._tend(child, now)
                self._stop.wait(0.2)
        finally:
            self._stop_all()
        return self.exit_code

    def _tend(self, child: Child, now: float) -> None:
        process = child.process
        if process is None:
            if now >= child.next_start:
                self._start(child, now)
            return
        code = process.poll()
        if code is None:
            up = now - child.started_at
            if child.down_since is not None and up >= UP_AFTER:
                log.info(
                    "%s up again after %.0f s down",
                    child.name,
                    child.started_at - child.down_since,
                )
                child.down_since = None
            if up >= HEALTHY_AFTER:
                child.backoff = self.first_backoff
            return
        child.process = None
        child.exits.append(code)
        if code in FATAL:
            log.error(
                "%s exited with code %d (%s): stopping", child.name, code, FATAL[code]
            )
            self.exit_code = code
            self._stop.set()
            return
        child.next_start = now + child.backoff
        # One line when it goes down; its tries while down are DEBUG.
        level = logging.WARNING if child.down_since is None else logging.DEBUG
        log.log(
            level,
            "%s down (exit %d%s): starting it again in %.0f s",
            child.name,
            code,
            ": Kafka or Postgres unavailable" if code == 4 else "",
            child.backoff,
        )
        child.down_since = child.down_since or now
        child.backoff = min(child.backoff * 2, MAX_BACKOFF)

    def _start(self, child: Child, now: float) -> None:
        child.process = subprocess.Popen(child.argv)
        child.started_at = now
        if child.down_since is not None:
            child.restarts += 1
            log.debug("%s started again (pid %d)", child.name, child.process.pid)
        else:
            log.info("%s started (pid %d)", child.name, child.process.pid)

    def _stop_all(self) -> None:
        running = [c for c in self.children if c.process is not None]
        for child in running:
            if child.process is not None and child.process.poll() is None:
                child.process.terminate()
        for child in running:
            if child.process is None:
                continue
            try:
                child.process.wait(60)
            except subprocess.TimeoutExpired:
                child.process.kill()
                child.process.wait()
            log.info("%s stopped", child.name)
