"""The pure half of the step protocol: command decisions and the tool agent's plan."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from es_agents.agent import ToolAgent
from es_agents.core import RunState, fold, replay
from es_agents.core.commands import (
    Approve,
    Cancel,
    FireTimer,
    ProvideInput,
    Reject,
    StartRun,
)
from es_agents.core.events import (
    Event,
    Interrupted,
    ModelCallRequested,
    ModelResponded,
    ToolCall,
)
from es_agents.core.step import (
    CallModel,
    CallTool,
    EventBuilder,
    Finish,
    Interrupt,
    Refused,
    canonical_json,
    decide,
    messages_hash,
    pass_gate,
    start,
    timer_id,
)
from es_agents.lab.research import create_ticket, search
from es_agents.models import ScriptedModel, call, reply

RUN = "run-1"


def _started() -> RunState:
    return fold(RunState(run_id=RUN), start(StartRun(run_id=RUN, agent="research")))


def _at_gate(gate: str = "create_ticket") -> RunState:
    state = _started()
    EventBuilder(state).add(
        Interrupted,
        reason="awaiting_approval",
        detail_json=canonical_json({"gate": gate}),
    )
    return state


def test_unknown_and_finished_runs_refuse_commands() -> None:
    with pytest.raises(Refused, match="unknown run"):
        decide(None, Approve(run_id=RUN, by="ann"))
    state = _started()
    decide(state, Cancel(run_id=RUN, by="ann", reason="enough"))
    assert state.status == "cancelled"
    assert state.terminal
    with pytest.raises(Refused, match="is cancelled"):
        decide(state, Approve(run_id=RUN, by="ann"))


def test_approve_resumes_the_gate_once() -> None:
    state = _at_gate()
    command = Approve(run_id=RUN, by="ann")
    (resumed,) = decide(state, command)
    assert state.status == "running"
    assert state.last_resume is not None
    assert state.last_resume.gate == "create_ticket"
    assert decide(state, command) == []  # the same command again: nothing
    with pytest.raises(Refused, match="not waiting for approval"):
        decide(state, Approve(run_id=RUN, by="bob"))
    assert resumed.seq == 2


def test_wrong_gate_and_wrong_wait_are_refused() -> None:
    with pytest.raises(Refused, match="waits at gate 'create_ticket', not 'deploy'"):
        decide(_at_gate(), Reject(run_id=RUN, by="ann", gate="deploy"))
    state = _started()
    EventBuilder(state).add(Interrupted, reason="awaiting_input")
    with pytest.raises(Refused, match="not waiting for approval"):
        decide(state, Approve(run_id=RUN, by="ann"))
    (resumed,) = decide(state, ProvideInput(run_id=RUN, by="ann", input_json='"x"'))
    assert resumed.wire_name == "resumed"
    assert state.last_resume is not None
    assert state.last_resume.input_json == '"x"'


def test_early_decision_is_kept_once_and_used_at_the_gate() -> None:
    state = _started()
    with pytest.raises(Refused, match="name the gate"):
        decide(state, Approve(run_id=RUN, by="ann"))
    decide(state, Approve(run_id=RUN, by="ann", gate="create_ticket"))
    with pytest.raises(Refused, match="already approved by ann"):
        decide(state, Approve(run_id=RUN, by="bob", gate="create_ticket"))
    out = EventBuilder(state)
    assert pass_gate(state, "create_ticket", out)
    assert [e.wire_name for e in out.events] == [
        "interrupted",
        "resumed",
        "state_patched",
    ]
    assert state.status == "running"
    assert state.early_decisions == {}
    assert not pass_gate(state, "create_ticket", EventBuilder(state))


def test_a_command_id_reused_for_another_body_is_refused() -> None:
    state = _started()
    first = StartRun(run_id=RUN, agent=state.agent, input_json=state.input_json)
    first = first.model_copy(update={"command_id": next(iter(state.command_ids))})
    assert decide(state, first) == []  # resent as it was: nothing happens
    twin = first.model_copy(update={"input_json": '{"other": true}'})
    with pytest.raises(Refused, match=r"another body \(another input\)"):
        decide(state, twin)

    early = Approve(run_id=RUN, by="ann", gate="create_ticket", command_id="c-1")
    decide(state, early)
    assert decide(state, early) == []
    with pytest.raises(Refused, match="was approved by ann"):
        decide(
            state, Reject(run_id=RUN, by="ann", gate="create_ticket", command_id="c-1")
        )
    with pytest.raises(Refused, match="was approved by ann"):
        decide(state, early.model_copy(update={"by": "bob"}))


def test_timers_wake_only_their_own_sleep() -> None:
    state = _started()
    event = EventBuilder(state).add(
        Interrupted, reason="sleeping", wake_at=datetime(2030, 1, 1, tzinfo=UTC)
    )
    due = datetime(2030, 1, 1, tzinfo=UTC)
    assert decide(state, FireTimer(run_id=RUN, timer_id="other", due_at=due)) == []
    assert state.status == "paused"
    fired = decide(
        state, FireTimer(run_id=RUN, timer_id=timer_id(RUN, event.seq), due_at=due)
    )
    assert [e.wire_name for e in fired] == ["resumed"]
    assert (
        decide(
            state, FireTimer(run_id=RUN, timer_id=timer_id(RUN, event.seq), due_at=due)
        )
        == []
    )


def _agent() -> ToolAgent:
    model = ScriptedModel(
        [
            call("search", "c1", query="q"),
            call("create_ticket", "c2", title="t"),
            reply("bye"),
        ]
    )
    return ToolAgent(
        name="research",
        system_prompt="sys",
        model=model,
        tool_list=[search, create_ticket],
    )


def _respond(state: RunState, *calls: ToolCall, content: str | None = None) -> None:
    out = EventBuilder(state)
    out.add(
        ModelCallRequested,
        step=state.step + 1,
        messages_hash="h",
        message_count=1,
        params_json="{}",
    )
    out.add(ModelResponded, tool_calls=calls, content=content)


def test_tool_agent_asks_the_model_then_runs_tools_behind_gates() -> None:
    agent = _agent()
    state = _started()
    first = agent.plan(state)
    assert isinstance(first, CallModel)
    assert first.messages[0] == {"role": "system", "content": "sys"}
    _respond(
        state, ToolCall(call_id="c2", name="create_ticket", args_json='{"title":"t"}')
    )
    gate = agent.plan(state)
    assert isinstance(gate, Interrupt)
    assert gate.gate == "create_ticket"
    EventBuilder(state).add(
        Interrupted,
        reason="awaiting_approval",
        detail_json=canonical_json({"gate": "create_ticket"}),
    )
    decide(state, Approve(run_id=RUN, by="ann"))
    assert agent.plan(state) == CallTool("c2", "create_ticket", {"title": "t"})


def test_tool_agent_finishes_on_rejection_and_on_a_plain_answer() -> None:
    agent = _agent()
    state = _started()
    _respond(state, ToolCall(call_id="c2", name="create_ticket", args_json="{}"))
    EventBuilder(state).add(
        Interrupted,
        reason="awaiting_approval",
        detail_json=canonical_json({"gate": "create_ticket"}),
    )
    decide(state, Reject(run_id=RUN, by="ann"))
    assert agent.plan(state) == Finish({"rejected": "create_ticket", "by": "ann"})
    other = _started()
    _respond(other, content="the answer")
    assert agent.plan(other) == Finish({"answer": "the answer"})


def test_messages_hash_is_canonical() -> None:
    a = messages_hash([{"role": "user", "content": "x", "name": None}])
    b = messages_hash([{"name": None, "content": "x", "role": "user"}])
    assert a == b
    assert a.startswith("sha256:")


def test_agent_versions_name_prompt_model_and_tools() -> None:
    versions = _agent().versions()
    assert versions["agent_version"] == "research@1"
    assert str(versions["prompt_hash"]).startswith("sha256:")
    assert versions["model_id"] == "scripted"
    changed = _agent()
    changed.system_prompt = "other"
    assert changed.versions()["prompt_hash"] != versions["prompt_hash"]


def test_applied_command_ids_survive_a_replay() -> None:
    state = _at_gate()
    command = Approve(run_id=RUN, by="ann")
    events: list[Event] = [
        start(StartRun(run_id=RUN, agent="research", command_id="c0"))
    ]
    events.append(
        Interrupted(
            run_id=RUN,
            seq=1,
            step=0,
            reason="awaiting_approval",
            detail_json=json.dumps({"gate": "g"}),
        )
    )
    events += decide(replay(events), command)
    assert replay(events).command_ids == {"c0", command.command_id}
    assert command.command_id not in state.command_ids
