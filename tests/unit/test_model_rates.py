"""A model's rate limits and 429s: a 429 is waited out (its Retry-After) and the
same request made again without a new attempt in the log or a spent retry, even
more times than the run's retries; the shared window holds requests and tokens per
minute; a cool-down holds every caller. Plus the pure window rules."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from es_agents.adapters.memory_rates import MemoryModelRates
from es_agents.agent import ToolAgent
from es_agents.core.events import ModelCallRequested
from es_agents.core.rates import InvalidRate, ModelRate, Window, current, wait_for
from es_agents.errors import RateLimited
from es_agents.models import Completion, ScriptedModel, reply
from es_agents.runtime.model_steps import MODEL_TRIES
from es_agents.testing import AgentHarness

T0 = datetime(2026, 12, 5, 12, 0, 10, tzinfo=UTC)


class Busy:
    """Says 429 (Retry-After 0.01 s) ``times`` times, then answers."""

    def __init__(self, times: int) -> None:
        self.left = times
        self.asked = 0

    def __call__(self, messages: Sequence[object]) -> Completion:
        self.asked += 1
        if self.left > 0:
            self.left -= 1
            raise RateLimited("model scripted: HTTP 429: slow down", retry_after=0.01)
        return reply("done")


def _agent(busy: Busy) -> ToolAgent:
    return ToolAgent(
        name="busy",
        system_prompt="Answer.",
        model=ScriptedModel([busy], model_id="scripted-busy"),
    )


def test_429s_are_waited_out_without_a_new_attempt_or_a_spent_retry(
    es_harness: Callable[[Any], AgentHarness],
) -> None:
    busy = Busy(MODEL_TRIES + 3)  # more 429s than the run has retries
    h = es_harness(_agent(busy))
    run_id = h.start()
    h.run()
    state = h.state(run_id)
    assert state.status == "completed", state.error
    assert busy.asked == MODEL_TRIES + 4
    requests = [e for e in h.events(run_id) if isinstance(e, ModelCallRequested)]
    assert [e.attempt for e in requests] == [1]  # the model took one request


def test_a_window_holds_requests_then_opens_at_the_next_minute() -> None:
    clock = [T0]
    rates = MemoryModelRates(lambda: clock[0])
    rate = ModelRate(requests_per_minute=2)
    assert rates.take("m", rate) == 0.0
    assert rates.take("m", rate) == 0.0
    assert rates.take("m", rate) == pytest.approx(50.0)  # until 12:01:00
    assert rates.take("other", rate) == 0.0  # models are counted apart
    clock[0] = T0 + timedelta(seconds=50)
    assert rates.take("m", rate) == 0.0


def test_tokens_used_hold_the_next_requests() -> None:
    clock = [T0]
    rates = MemoryModelRates(lambda: clock[0])
    rate = ModelRate(tokens_per_minute=1000)
    assert rates.take("m", rate) == 0.0
    rates.spend("m", 1200)  # an answer over the minute's tokens
    assert rates.take("m", rate) > 0
    clock[0] = T0 + timedelta(minutes=1)
    assert rates.take("m", rate) == 0.0


def test_a_cool_down_holds_every_caller_until_it_ends() -> None:
    clock = [T0]
    rates = MemoryModelRates(lambda: clock[0])
    rates.cool_down("m", 30)
    assert rates.take("m", ModelRate()) == pytest.approx(30.0)
    rates.cool_down("m", 5)  # a shorter one does not shorten it
    clock[0] = T0 + timedelta(seconds=29)
    assert rates.take("m", ModelRate()) == pytest.approx(1.0)
    clock[0] = T0 + timedelta(seconds=31)
    assert rates.take("m", ModelRate()) == 0.0


def test_the_pure_rules() -> None:
    with pytest.raises(InvalidRate):
        ModelRate(requests_per_minute=0)
    old = Window(T0.replace(second=0), requests=9, tokens=9)
    fresh = current(old, T0 + timedelta(minutes=1))
    assert (fresh.requests, fresh.tokens) == (0, 0)
    assert wait_for(old, ModelRate(requests_per_minute=10), T0) == 0.0
    assert wait_for(old, ModelRate(requests_per_minute=9), T0) == pytest.approx(50.0)
