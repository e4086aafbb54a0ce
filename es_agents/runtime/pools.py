"""Where blocking work runs while the event loop steps runs: the ports' calls
(Postgres, the object store, reading the log) on one bounded pool, synchronous
tools and model clients on another whose threads are daemons (a call past its
timeout keeps its thread: Python cannot stop one, and it must not keep a stopping
worker alive). ``async def`` tools and async model clients need neither: they are
awaited on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar, final

from es_agents.runtime.daemon_pool import DaemonPool

P = ParamSpec("P")
T = TypeVar("T")


@final
class Blocking:
    """The ports' blocking calls, at most ``size`` at a time."""

    def __init__(self, size: int = 16) -> None:
        self._pool = ThreadPoolExecutor(size, thread_name_prefix="es-io")

    async def __call__(
        self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs
    ) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._pool, functools.partial(fn, *args, **kwargs)
        )

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class Overdue(Exception):
    """A call still running past its timeout."""


@final
class Calls:
    """Tool and model calls, at most ``limit`` at once per worker: plain ones each
    on a daemon thread, ``async`` ones on the loop; every one waited for at most
    its timeout."""

    def __init__(self, limit: int = 64) -> None:
        self.limit = limit
        self._threads = DaemonPool("es-call")
        self._slots: asyncio.Semaphore | None = None

    def _semaphore(self) -> asyncio.Semaphore:
        if self._slots is None:  # made on the loop it is used on
            self._slots = asyncio.Semaphore(self.limit)
        return self._slots

    async def run(self, fn: Callable[[], T], timeout: float | None = None) -> T:
        """``fn()`` on a daemon thread; ``Overdue`` past ``timeout`` (the thread
        goes on, its result is dropped)."""
        async with self._semaphore():
            loop = asyncio.get_running_loop()
            answer: asyncio.Future[T] = loop.create_future()

            def call() -> None:  # on the daemon thread; must not raise
                report: Callable[[], None]
                try:
                    report = functools.partial(_settle, answer, fn())
                except BaseException as e:
                    report = functools.partial(_fail, answer, e)
                with contextlib.suppress(RuntimeError):  # the loop closed: gone
                    loop.call_soon_threadsafe(report)

            self._threads.post(call)
            if timeout is None:
                return await answer
            late = loop.call_later(timeout, _expire, answer)
            try:
                return await answer
            finally:
                late.cancel()

    async def wait(self, call: Awaitable[T], timeout: float | None = None) -> T:
        """An ``async`` call awaited on the loop; cancelled and ``Overdue`` past
        ``timeout`` (a ``TimeoutError`` of the call's own is its own)."""
        deadline = asyncio.timeout(timeout)
        try:
            async with self._semaphore(), deadline:
                return await call
        except TimeoutError:
            if deadline.expired():
                raise Overdue from None
            raise


def _settle(answer: asyncio.Future[T], result: T) -> None:
    if not answer.done():  # else expired meanwhile
        answer.set_result(result)


def _fail(answer: asyncio.Future[T], error: BaseException) -> None:
    if not answer.done():
        answer.set_exception(error)


def _expire(answer: asyncio.Future[T]) -> None:
    if not answer.done():
        answer.set_exception(Overdue())
