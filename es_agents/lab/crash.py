"""Crash points: a process SIGKILLs itself at an exact protocol boundary (tests)."""

from __future__ import annotations

import logging
import os
import signal
import threading

log = logging.getLogger(__name__)


class CrashPoints:
    """``ES_AGENTS_CRASH_AT=point[@n],...``: SIGKILL this process the n-th time (default
    first) it passes ``point``. Points: ``before_append:<event>``,
    ``after_append:<event>``, ``after_action:model``, ``after_action:tool``,
    ``after_send:schedule`` (a schedule's starts sent, its next tick not moved on).
    Used by the crash tests and the demo to stop a worker at an exact protocol
    boundary."""

    def __init__(self, spec: str | None) -> None:
        self._targets: dict[str, int] = {}
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()
        for item in (spec or "").split(","):
            if item.strip():
                point, _, nth = item.strip().partition("@")
                self._targets[point] = int(nth or 1)

    @classmethod
    def from_env(cls) -> CrashPoints:
        return cls(os.environ.get("ES_AGENTS_CRASH_AT"))

    def hit(self, point: str) -> None:
        if point not in self._targets:
            return
        with self._lock:
            self._counts[point] = self._counts.get(point, 0) + 1
            if self._counts[point] == self._targets[point]:
                log.warning("crash point %s reached: SIGKILL", point)
                os.kill(os.getpid(), signal.SIGKILL)
