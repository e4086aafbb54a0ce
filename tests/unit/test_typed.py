"""Typed agents on the in-memory stack: an input that does not fit the input model
is refused at the start with the reasons; the final answer must fit the output
model (a model that answers badly is told why and asked again, three tries at
most); the output reads back typed; the schemas are part of the version gate."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from pydantic import BaseModel

from es_agents.agent import ToolAgent
from es_agents.client import Client
from es_agents.core.commands import StartRun
from es_agents.core.events import ModelCallRequested, RunFailed
from es_agents.errors import ConfigError
from es_agents.models import Completion, ScriptedModel, reply
from es_agents.testing import AgentHarness
from es_agents.typed import OUTPUT_INVALID, OUTPUT_TRIES


class Ticket(BaseModel):
    title: str
    priority: int


class Triage(BaseModel):
    team: str
    urgent: bool


def _triage(script: Sequence[Any]) -> ToolAgent:
    return ToolAgent(
        name="triage",
        system_prompt="Route the ticket.",
        model=ScriptedModel(list(script)),
        input_model=Ticket,
        output_model=Triage,
    )


def test_an_input_that_does_not_fit_is_refused_at_the_start(
    es_harness: Callable[[Any], AgentHarness],
) -> None:
    h = es_harness(_triage([reply('{"team": "ops", "urgent": true}')]))
    bad = StartRun(run_id="r-bad", agent="triage", input_json='{"title": "x"}')
    h.ports.log.send(bad)
    h.run()
    verdict = next(v for v in h.ports.book.for_run("r-bad"))
    assert verdict.status == "refused"
    assert "does not fit Ticket" in (verdict.reason or "")
    assert "priority: Field required" in (verdict.reason or "")
    assert h.events("r-bad") == []


def test_the_output_fits_and_reads_back_typed(
    es_harness: Callable[[Any], AgentHarness],
) -> None:
    seen: list[str] = []

    def first(messages: Sequence[dict[str, Any]]) -> Completion:
        seen.append(str(messages[0]["content"]))
        return reply('```json\n{"team": "ops", "urgent": true}\n```')

    h = es_harness(_triage([first]))
    run_id = h.start('{"title": "printer on fire", "priority": 1}')
    h.run()
    assert "Triage" in seen[0]  # the system prompt describes the output
    assert '"urgent"' in seen[0]
    view = Client(h.settings, ports=h.ports).status(run_id)
    assert view.status == "completed"
    assert view.output_as(Triage) == Triage(team="ops", urgent=True)


def test_an_answer_that_does_not_fit_is_asked_again_then_fails(
    es_harness: Callable[[Any], AgentHarness],
) -> None:
    told: list[str] = []

    def again(messages: Sequence[dict[str, Any]]) -> Completion:
        told.append(str(messages[-1]["content"]))
        return reply('{"team": "ops", "urgent": true}')

    h = es_harness(_triage([reply("ops, I think"), again]))
    run_id = h.start('{"title": "x", "priority": 2}')
    h.run()
    state = h.state(run_id)
    assert state.status == "completed"
    assert json.loads(state.output_json or "") == {"team": "ops", "urgent": True}
    assert told
    assert "does not fit Triage" in told[0]

    stubborn = es_harness(_triage([reply("no") for _ in range(10)]))
    run_id = stubborn.start('{"title": "x", "priority": 2}')
    stubborn.run()
    state = stubborn.state(run_id)
    assert state.status == "failed"
    failed = [e for e in stubborn.events(run_id) if isinstance(e, RunFailed)]
    assert [e.kind for e in failed] == [OUTPUT_INVALID]
    assert "does not fit Triage after 3 tries" in failed[0].error
    asked = [e for e in stubborn.events(run_id) if isinstance(e, ModelCallRequested)]
    assert len(asked) == OUTPUT_TRIES


def test_the_schemas_are_part_of_the_version_gate() -> None:
    typed = _triage([])
    plain = ToolAgent(name="triage", system_prompt="Route the ticket.", model=None)

    class Triage2(BaseModel):
        team: str

    other = ToolAgent(
        name="triage",
        system_prompt="Route the ticket.",
        model=None,
        input_model=Ticket,
        output_model=Triage2,
    )
    hashes = {a.versions()["tools_hash"] for a in (typed, plain, other)}
    assert len(hashes) == 3
    with pytest.raises(ConfigError, match="no single output"):
        ToolAgent(
            name="t", system_prompt="s", model=None, conversational=True,
            output_model=Triage,
        )  # fmt: skip
