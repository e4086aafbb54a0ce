"""Run budgets: a model that keeps calling tools is stopped at the agent's limit,
with the limit in the run's error; the default stops a runaway; unlimited runs on;
a budget survives a crash between its check and its failure record."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel, JsonValue

from es_agents.agent import ToolAgent
from es_agents.core.budget import BUDGET_EXCEEDED, DEFAULT_BUDGET, Budget
from es_agents.core.events import RunFailed, ToolCallRequested
from es_agents.core.state import RunState
from es_agents.models import ScriptedModel, call, reply
from es_agents.settings import ModelPrice
from es_agents.testing import AgentHarness
from es_agents.tools import ToolContext, tool

EFFECTS: list[str] = []


class Note(BaseModel):
    text: str


@tool(Note, name="jot")
def jot(args: Note, ctx: ToolContext) -> JsonValue:
    EFFECTS.append(ctx.idempotency_key)
    return {"ok": True}


def _runaway(calls: int, budget: Budget) -> ToolAgent:
    script = [call("jot", f"c{n}", text=f"n{n}") for n in range(calls)]
    script.append(reply("done"))
    return ToolAgent(
        name="runaway",
        system_prompt="Jot for ever.",
        model=ScriptedModel(script, model_id="scripted"),
        tool_list=[jot],
        budget=budget,
    )


def test_model_calls_stop_at_the_limit(
    es_harness: Callable[[Any], AgentHarness],
) -> None:
    EFFECTS.clear()
    h = es_harness(_runaway(50, Budget(max_model_calls=5)))
    run_id = h.start()
    h.run()
    state = h.state(run_id)
    assert state.status == "failed"
    assert state.model_calls == 5
    failed = [e for e in h.events(run_id) if isinstance(e, RunFailed)]
    assert len(failed) == 1
    assert failed[0].kind == BUDGET_EXCEEDED
    assert "5 model calls of at most 5" in failed[0].error
    calls = [e for e in h.events(run_id) if isinstance(e, ToolCallRequested)]
    assert len(calls) == len(EFFECTS) == 5  # each answered call ran once


def test_steps_and_tokens_have_limits(
    es_harness: Callable[[Any], AgentHarness],
) -> None:
    h = es_harness(_runaway(50, Budget(max_steps=7, max_model_calls=None)))
    run_id = h.start()
    h.run()
    failed = [e for e in h.events(run_id) if isinstance(e, RunFailed)]
    assert failed
    assert "steps of at most 7" in failed[0].error
    assert h.state(run_id).step <= 8


def test_unlimited_runs_to_the_end_and_a_short_run_is_untouched(
    es_harness: Callable[[Any], AgentHarness],
) -> None:
    h = es_harness(_runaway(30, Budget.unlimited()))
    run_id = h.start()
    h.run()
    assert h.state(run_id).status == "completed"
    assert h.state(run_id).model_calls == 31


def test_the_default_stops_a_runaway_and_limits_are_checked() -> None:
    assert DEFAULT_BUDGET.max_model_calls == 1_000
    state = RunState(run_id="r", model_calls=1_000)
    assert DEFAULT_BUDGET.over(state, datetime.now(UTC)) is not None
    state = RunState(run_id="r", model_calls=10, prompt_tokens=9_000_000)
    state.completion_tokens = 1_000_000
    assert "tokens" in str(DEFAULT_BUDGET.over(state, datetime.now(UTC)))
    started = datetime.now(UTC) - timedelta(seconds=61)
    timed = RunState(run_id="r", started_at=started)
    over = Budget(max_seconds=60).over(timed, datetime.now(UTC))
    assert over is not None
    assert "since the start" in over
    assert Budget(max_seconds=120).over(timed, datetime.now(UTC)) is None
    with pytest.raises(ValueError, match="positive"):
        Budget(max_model_calls=0)


def test_a_budget_that_pauses_waits_for_a_person(
    es_harness: Callable[[Any], AgentHarness],
) -> None:
    """``on_exceeded="pause"``: the run waits (``budget_exceeded``); an approval
    grants as much again, a rejection ends it; every call the model asked for
    within the budget ran once."""
    EFFECTS.clear()
    h = es_harness(_runaway(50, Budget(max_model_calls=3, on_exceeded="pause")))
    run_id = h.start()
    h.run()
    state = h.state(run_id)
    assert state.status == "paused"
    assert state.waiting is not None
    assert state.waiting.reason == BUDGET_EXCEEDED
    assert "3 model calls of at most 3" in state.waiting.detail_json
    h.approve(run_id, by="ops")
    h.run()
    state = h.state(run_id)
    assert (state.status, state.model_calls) == ("paused", 6)  # as much again
    h.reject(run_id, by="ops", reason="enough")
    h.run()
    state = h.state(run_id)
    assert state.status == "failed"
    failed = [e for e in h.events(run_id) if isinstance(e, RunFailed)]
    assert failed[0].kind == BUDGET_EXCEEDED
    assert "ops decided to stop: enough" in failed[0].error
    assert len(EFFECTS) == len(set(EFFECTS)) == 6


def test_a_run_may_have_its_own_limits(
    es_harness: Callable[[Any], AgentHarness],
) -> None:
    h = es_harness(_runaway(30, Budget.unlimited()))
    own = h.start(budget={"max_model_calls": 2})
    bad = h.start(budget={"max_model_calls": 0})
    unknown = h.start(budget={"max_apples": 3})
    other = h.start()
    h.run()
    assert h.state(own).status == "failed"
    assert h.state(own).model_calls == 2
    assert h.state(other).status == "completed"  # its agent's: unlimited
    for refused, why in ((bad, "positive"), (unknown, "unknown limit")):
        assert h.events(refused) == []
        verdicts = h.ports.book.for_run(refused)
        assert [v.status for v in verdicts] == ["refused"]
        assert why in str(verdicts[0].reason)


def test_a_cost_limit_prices_the_runs_model() -> None:
    state = RunState(run_id="r", prompt_tokens=900_000, completion_tokens=50_000)
    state.versions.model_id = "gpt-x"
    budget = Budget(max_cost=1.0)
    assert budget.over(state, None, cost=0.99) is None
    over = budget.over(state, None, cost=1.2)
    assert over == "budget exceeded: 1.2000 USD of at most 1 USD"
    unpriced = budget.over(state, None, cost=None)
    assert unpriced is not None
    assert "no price for model 'gpt-x'" in unpriced
    assert budget.over(state, None, model=False, cost=None) is None  # tools go on
    granted = Budget(max_cost=1.0, max_steps=10).granted(2)
    assert (granted.max_cost, granted.max_steps) == (3.0, 30)


def test_a_run_stops_at_its_cost_as_the_settings_price_it(
    es_harness: Callable[[Any], AgentHarness],
) -> None:
    h = es_harness(_runaway(30, Budget(max_cost=20.0)))
    # The scripted model answers with 8 completion tokens: 8 USD a call.
    prices = {"scripted": ModelPrice(input=0, output=1_000_000)}
    h.settings = h.settings.model_copy(update={"prices": prices})
    run_id = h.start()
    h.run()
    state = h.state(run_id)
    assert state.status == "failed"
    assert state.model_calls == 3  # 24 USD after the third
    assert "24.0000 USD of at most 20 USD" in str(state.error)
