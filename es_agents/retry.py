"""One retry policy, on tenacity: jittered exponential backoff that honours a
server's ``Retry-After`` (an exception's ``retry_after``), for model calls, tool calls
and the log's metadata waits."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential_jitter,
)
from tenacity.stop import stop_base

# Longest wait a server's Retry-After may impose on one attempt.
MAX_RETRY_AFTER = 60.0


def backoff(
    initial: float = 0.2, maximum: float = 5.0
) -> Callable[[RetryCallState], float]:
    """Exponential with jitter; a ``retry_after`` on the failure wins when longer."""
    exponential = wait_exponential_jitter(
        multiplier=initial, max=maximum, jitter=initial
    )

    def wait(state: RetryCallState) -> float:
        delay = float(exponential(state))
        failure = state.outcome.exception() if state.outcome is not None else None
        asked = getattr(failure, "retry_after", None)
        if isinstance(asked, int | float):
            delay = max(delay, min(float(asked), MAX_RETRY_AFTER))
        return delay

    return wait


def retrying(
    tries: int,
    on: tuple[type[BaseException], ...],
    initial: float = 0.2,
    maximum: float = 5.0,
    within: float | None = None,
) -> Retrying:
    """Up to ``tries`` attempts (and ``within`` seconds) while the failure is one of
    ``on``; the last failure is raised as it is."""
    stop: stop_base = stop_after_attempt(tries)
    if within is not None:
        stop = stop | stop_after_delay(within)
    return Retrying(
        stop=stop,
        wait=backoff(initial, maximum),
        retry=retry_if_exception_type(on),
        reraise=True,
    )


def aretrying(
    tries: int,
    on: tuple[type[BaseException], ...],
    initial: float = 0.2,
    maximum: float = 5.0,
    wait_first: bool = False,
) -> AsyncRetrying:
    """``retrying`` for a coroutine: its waits sleep on the event loop.
    ``wait_first``: these tries follow one that failed already (made without the
    policy): wait before the first of them too."""
    if wait_first:
        return AsyncRetrying(
            stop=stop_after_attempt(tries),
            wait=backoff(initial, maximum),
            retry=retry_if_exception_type(on),
            before=_wait_first(initial),
            reraise=True,
        )
    return AsyncRetrying(
        stop=stop_after_attempt(tries),
        wait=backoff(initial, maximum),
        retry=retry_if_exception_type(on),
        reraise=True,
    )


def _wait_first(initial: float) -> Callable[[RetryCallState], Awaitable[None]]:
    async def wait(state: RetryCallState) -> None:
        if state.attempt_number == 1:
            await asyncio.sleep(initial + random.uniform(0, initial))  # noqa: S311

    return wait
