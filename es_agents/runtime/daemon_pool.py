"""Daemon threads for calls that may never return (tools past their timeout).

``concurrent.futures.ThreadPoolExecutor`` joins its threads at interpreter exit, so
a hung tool would keep a stopping worker alive forever; these threads are daemons and
are reused, so a call costs a hand-off instead of a thread start.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar, final

T = TypeVar("T")


@final
class DaemonPool:
    def __init__(self, name: str = "call") -> None:
        self._name = name
        self._tasks: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._count = 0

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        """``fn()`` on a daemon thread; its future."""
        future: Future[T] = Future()

        def call() -> None:
            try:
                future.set_result(fn())
            except BaseException as e:
                future.set_exception(e)

        self.post(call)
        return future

    def post(self, job: Callable[[], None]) -> None:
        """``job()`` on a daemon thread, nothing waited for: the job reports its
        outcome itself (no future to make per call). It must not raise."""
        with self._lock:
            start = self._idle == 0
            if start:
                self._count += 1
            else:
                self._idle -= 1
        self._tasks.put(job)
        if start:
            threading.Thread(
                target=self._serve, daemon=True, name=f"{self._name}-{self._count}"
            ).start()

    def _serve(self) -> None:
        while True:
            self._tasks.get()()
            with self._lock:
                self._idle += 1
