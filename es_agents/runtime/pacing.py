"""Model calls in turn: a model's rate limits shared by every worker, and a 429
waited out without spending the run's retries (``core.rates``).

Before a call, the run takes a request of the model's current window
(``ModelRates.take``); when the window is full, or a 429's cool-down runs, it waits
its turn and asks again. When the model answers 429 anyway, every worker is told to
hold off for its ``Retry-After`` (``cool_down``) and the same request is made again
once that passed: the model did not take it, so this is neither a new attempt in
the log nor one of the run's retries. Only after ``PATIENCE`` seconds of 429s does
the call count as unavailable, as any other failure. An answer's tokens are
counted in the window it came in.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from es_agents.core.rates import ModelRate
from es_agents.errors import RateLimited
from es_agents.models import Completion
from es_agents.runtime.context import RunContext

log = logging.getLogger(__name__)

PATIENCE = 600.0  # seconds of 429s before a call counts as unavailable
FIRST_WAIT = 1.0  # a 429 without Retry-After: 1 s, then twice as long, up to 60
MAX_WAIT = 60.0


async def in_turn(
    ctx: RunContext, model_id: str, call: Callable[[], Awaitable[Completion]]
) -> Completion:
    """``call`` made when the model's limits let it, again after each 429."""
    rates = ctx.rates
    rate = ctx.rate_limits.get(model_id)
    deadline = time.monotonic() + PATIENCE
    pause = FIRST_WAIT
    while True:
        if rates is not None and rate is not None:
            await _turn(ctx, model_id, rate)
        try:
            completion = await call()
        except RateLimited as e:
            if time.monotonic() > deadline:
                raise
            wait = min(e.retry_after or pause, MAX_WAIT)
            pause = min(pause * 2, MAX_WAIT)
            log.info("model %s said 429: every call waits %.1f s", model_id, wait)
            if rates is not None:
                await ctx.io(rates.cool_down, model_id, wait)
            await asyncio.sleep(wait)
            continue
        if rates is not None and rate is not None and rate.tokens_per_minute:
            used = completion.usage.prompt_tokens + completion.usage.completion_tokens
            await ctx.io(rates.spend, model_id, used)
        return completion


async def _turn(ctx: RunContext, model_id: str, rate: ModelRate) -> None:
    rates = ctx.rates
    assert rates is not None  # noqa: S101 - checked by the caller
    while True:
        wait = await ctx.io(rates.take, model_id, rate)
        if wait <= 0:
            return
        await asyncio.sleep(min(wait, MAX_WAIT))
