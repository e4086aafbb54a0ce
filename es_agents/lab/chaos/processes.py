"""Supervised processes of the chaos run: started again whenever they exit."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Child:
    """A supervised process: started again whenever it exits."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    crash_at: str = ""  # armed crash point of the current process
    killed: bool = False  # the harness killed the current process
    paused: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    exits: Counter[str] = field(default_factory=Counter)
    next_start: float = 0.0
    backoff: float = 0.5
    started_at: float = 0.0

    def start(self, crash_at: str = "") -> None:
        env = {**self.env, "ES_AGENTS_CRASH_AT": crash_at}
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                self.argv,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.crash_at, self.killed = crash_at, False
        self.started_at = time.monotonic()

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(sig)

    def kill(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.killed = True
            self.popen.send_signal(signal.SIGCONT)
            self.popen.kill()
            self.popen.wait(30)

    def stop(self, timeout: float = 60) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGCONT)
            self.popen.terminate()
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def supervise(self) -> None:
        """Record an exit and start the process again (with a growing backoff)."""
        with self.lock:
            if self.popen is None or self.paused or self.popen.poll() is None:
                return
            code = self.popen.returncode
            if self.next_start == 0.0:
                if self.killed:
                    kind = "killed_by_chaos"
                elif code == -signal.SIGKILL and self.crash_at:
                    kind = "crash_point"
                else:
                    kind = f"exit_{code}"
                self.exits[kind] += 1
                ran = time.monotonic() - self.started_at
                failing = kind == f"exit_{code}" and ran < 30
                self.backoff = min(self.backoff * 2, 8) if failing else 0.5
                self.next_start = time.monotonic() + self.backoff
                return
            if time.monotonic() >= self.next_start:
                self.next_start = 0.0
                self.start()
