"""Decisions that talk back, on the in-memory stack: an approval with edited
arguments runs the call with them (the model's call stays in the log beside the
edit, a signature binds the edited arguments); an edit that is not a JSON object,
or on a gate with a quorum, is refused with the reason."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, Literal

import pytest
from pydantic import BaseModel, JsonValue

from es_agents.agent import ToolAgent
from es_agents.approvals import MemoryKeyring, SigningKey, new_key
from es_agents.core.approvals import ApprovalPolicy, answered, pause_of
from es_agents.core.commands import Approve
from es_agents.core.events import ModelResponded, Resumed, ToolReturned
from es_agents.core.step import Refused, args_hash, decide
from es_agents.models import Completion, ScriptedModel, call, reply
from es_agents.testing import AgentHarness, Crashed, VirtualClock
from es_agents.tools import ToolContext, ask_human, tool

WIRES: list[int] = []


class Wire(BaseModel):
    amount: int


@tool(Wire, requires_approval=True)
def wire(args: Wire, ctx: ToolContext) -> JsonValue:
    WIRES.append(args.amount)
    return {"sent": args.amount}


@tool(Wire, name="wire", approval=ApprovalPolicy(signed=True))
def signed_wire(args: Wire, ctx: ToolContext) -> JsonValue:
    WIRES.append(args.amount)
    return {"sent": args.amount}


@tool(Wire, name="wire", approval=ApprovalPolicy(quorum=2))
def four_eyes_wire(args: Wire, ctx: ToolContext) -> JsonValue:
    WIRES.append(args.amount)
    return {"sent": args.amount}


def _payer(tool_: Any) -> ToolAgent:
    return ToolAgent(
        name="payer",
        system_prompt="Pay.",
        model=ScriptedModel([call("wire", "w1", amount=5000), reply("done")]),
        tool_list=[tool_],
    )


@pytest.fixture(autouse=True)
def _clear() -> None:
    WIRES.clear()


def test_an_edited_approval_runs_the_call_with_the_edit(
    es_harness: Callable[[Any], AgentHarness],
) -> None:
    h = es_harness(_payer(wire))
    run_id = h.start()
    h.run()
    h.approve(run_id, by="lead", args_json='{"amount": 900}')
    h.run()
    assert WIRES == [900]
    events = h.events(run_id)
    asked = next(e for e in events if isinstance(e, ModelResponded) and e.tool_calls)
    assert json.loads(asked.tool_calls[0].args_json) == {"amount": 5000}  # kept
    resumed = next(e for e in events if isinstance(e, Resumed))
    assert resumed.input_json == '{"amount":900}'
    assert resumed.args_hash == args_hash('{"amount":900}')
    assert h.state(run_id).status == "completed"


def test_edits_that_are_no_object_are_refused(
    es_harness: Callable[[Any], AgentHarness],
) -> None:
    h = es_harness(_payer(wire))
    run_id = h.start()
    h.run()
    state = h.state(run_id)
    for bad, why in (("[1]", "a JSON object"), ("{nope", "not JSON")):
        with pytest.raises(Refused, match=why):
            decide(state, Approve(run_id=run_id, by="lead", args_json=bad))


def _keyed(h: AgentHarness, identity: str) -> SigningKey:
    assert isinstance(h.ports.keyring, MemoryKeyring)
    pem, key = new_key(identity, frozenset())
    h.ports.keyring.add(key)
    return SigningKey.load(pem)


def test_a_signature_binds_the_edited_arguments(
    es_harness: Callable[[Any], AgentHarness],
) -> None:
    h = es_harness(_payer(signed_wire))
    run_id = h.start()
    h.run()
    key = _keyed(h, "lead")
    pause = pause_of(h.state(run_id))
    assert pause is not None
    edit = Approve(run_id=run_id, by="lead", args_json='{"amount": 900}')
    # Signed for the model's arguments, then sent with an edit: refused.
    signature, expires = key.sign(pause, "approved", "lead", timedelta(minutes=5))
    swapped = edit.model_copy(
        update={"key_id": key.key_id, "signature": signature, "expires_at": expires}
    )
    h.ports.log.send(swapped)
    h.run()
    assert WIRES == []
    verdict = next(
        v for v in h.ports.book.for_run(run_id) if v.command_id == swapped.command_id
    )
    assert verdict.status == "refused"
    assert "signature does not match" in (verdict.reason or "")
    # Signed over the edit: the call runs with it.
    signature, expires = key.sign(
        answered(pause, edit), "approved", "lead", timedelta(minutes=5)
    )
    good = edit.model_copy(
        update={
            "command_id": "signed-edit",
            "key_id": key.key_id,
            "signature": signature,
            "expires_at": expires,
        }
    )
    h.ports.log.send(good)
    h.run()
    assert WIRES == [900]


def test_a_gate_with_a_quorum_takes_no_edit(
    es_harness: Callable[[Any], AgentHarness],
) -> None:
    h = es_harness(_payer(four_eyes_wire))
    run_id = h.start()
    h.run()
    h.approve(run_id, by="ann", args_json='{"amount": 1}')
    h.run()
    assert WIRES == []
    refused = [v for v in h.ports.book.for_run(run_id) if v.status == "refused"]
    assert len(refused) == 1
    assert "cannot be edited" in (refused[0].reason or "")


class Choice(BaseModel):
    plan: Literal["basic", "pro"]


def test_ask_human_pauses_for_an_answer_that_fits_and_the_model_reads_it(
    es_harness: Callable[[Any], AgentHarness],
) -> None:
    seen: list[str] = []

    def after(messages: Sequence[dict[str, Any]]) -> Completion:
        seen.append(str(messages[-1]["content"]))
        return reply("You chose pro.")

    agent = ToolAgent(
        name="seller",
        system_prompt="Sell.",
        model=ScriptedModel([call("ask_human", "q1", question="Which plan?"), after]),
        tool_list=[ask_human(Choice)],
    )
    h = es_harness(agent)
    run_id = h.start()
    h.run()
    state = h.state(run_id)
    assert state.waiting is not None
    assert state.waiting.reason == "awaiting_input"
    detail = json.loads(state.waiting.detail_json)
    assert detail["question"] == "Which plan?"
    assert detail["answer_schema"]["properties"]["plan"]["enum"] == ["basic", "pro"]
    h.provide_input(run_id, '{"plan": "gold"}')  # does not fit: asked again
    h.run()
    state = h.state(run_id)
    assert state.waiting is not None
    assert "does not fit" in json.loads(state.waiting.detail_json)["invalid"]
    h.provide_input(run_id, '{"plan": "pro"}')
    h.run()
    state = h.state(run_id)
    assert state.status == "completed"
    assert seen == ['{"plan":"pro"}']  # the answer is the call's result
    assert state.tool_calls == 0  # nothing ran


def test_ask_human_without_a_schema_takes_any_answer(
    es_harness: Callable[[Any], AgentHarness],
) -> None:
    agent = ToolAgent(
        name="asker",
        system_prompt="Ask.",
        model=ScriptedModel([call("ask_human", "q1", question="Name?"), reply("ok")]),
        tool_list=[ask_human()],
    )
    h = es_harness(agent)
    run_id = h.start()
    h.run()
    h.provide_input(run_id, '"Ada"')
    h.run()
    events = h.events(run_id)
    returned = [e for e in events if isinstance(e, ToolReturned)]
    assert [e.result_json for e in returned] == ['"Ada"']
    assert h.state(run_id).status == "completed"


@tool(
    Wire,
    name="wire",
    requires_approval=True,
    on_reject="tell_model",
    decide_within=timedelta(hours=4),
)
def wire_by_deadline(args: Wire, ctx: ToolContext) -> JsonValue:
    WIRES.append(args.amount)
    return {"sent": args.amount}


def test_a_call_nobody_decides_in_time_is_rejected_at_its_deadline(
    es_harness: Callable[[Any], AgentHarness], virtual_clock: VirtualClock
) -> None:
    told: list[str] = []

    def after(messages: Sequence[dict[str, Any]]) -> Completion:
        told.append(str(messages[-1]["content"]))
        return reply("Nobody approved the wire; I did not send it.")

    agent = ToolAgent(
        name="payer",
        system_prompt="Pay.",
        model=ScriptedModel([call("wire", "w1", amount=50), after]),
        tool_list=[wire_by_deadline],
    )
    h = es_harness(agent)
    run_id = h.start()
    h.run()
    state = h.state(run_id)
    assert state.waiting is not None
    assert state.waiting.wake_at is not None  # the deadline, on the durable timers
    answered = next(e for e in h.events(run_id) if isinstance(e, ModelResponded))
    assert state.waiting.wake_at - answered.at == timedelta(hours=4)
    virtual_clock.advance(3 * 3600)
    h.run()
    assert h.state(run_id).status == "paused"  # not yet
    virtual_clock.advance(2 * 3600)
    h.run()
    state = h.state(run_id)
    assert state.status == "completed"
    assert WIRES == []
    assert told[0].startswith("error: rejected by (deadline): the call did not run")
    assert "no decision by" in told[0]


def test_a_decision_in_time_leaves_the_deadline_with_nothing_to_do(
    es_harness: Callable[[Any], AgentHarness], virtual_clock: VirtualClock
) -> None:
    agent = ToolAgent(
        name="payer",
        system_prompt="Pay.",
        model=ScriptedModel([call("wire", "w1", amount=50), reply("sent")]),
        tool_list=[wire_by_deadline],
    )
    h = es_harness(agent)
    run_id = h.start()
    h.run()
    h.approve(run_id, by="lead")
    h.run()
    seq = h.state(run_id).seq
    virtual_clock.advance(5 * 3600)  # the timer fires on a run that moved on
    h.run()
    state = h.state(run_id)
    assert state.status == "completed"
    assert state.seq == seq
    assert WIRES == [50]


@pytest.mark.parametrize(
    "point", ["after_append:resumed", "after_append:tool_call_requested"]
)
def test_a_crash_between_an_edit_and_its_call_runs_the_edit_once(
    es_harness: Callable[[Any], AgentHarness], point: str
) -> None:
    h = es_harness(_payer(wire))
    run_id = h.start()
    h.run()
    h.approve(run_id, by="lead", args_json='{"amount": 900}')
    with pytest.raises(Crashed):
        h.run(crash_at=point)
    h.run()
    assert WIRES == [900]
    assert h.state(run_id).status == "completed"


def test_a_crash_as_a_deadline_fires_rejects_once(
    es_harness: Callable[[Any], AgentHarness], virtual_clock: VirtualClock
) -> None:
    told: list[str] = []

    def after(messages: Sequence[dict[str, Any]]) -> Completion:
        told.append(str(messages[-1]["content"]))
        return reply("not sent")

    agent = ToolAgent(
        name="payer",
        system_prompt="Pay.",
        model=ScriptedModel([call("wire", "w1", amount=50), after]),
        tool_list=[wire_by_deadline],
    )
    h = es_harness(agent)
    run_id = h.start()
    h.run()
    virtual_clock.advance(5 * 3600)
    with pytest.raises(Crashed):
        h.run(crash_at="after_append:resumed")  # the rejection durable, then death
    h.run()
    state = h.state(run_id)
    assert state.status == "completed"
    resumed = [e for e in h.events(run_id) if isinstance(e, Resumed)]
    assert [(e.reason, e.by) for e in resumed] == [("rejected", "(deadline)")]
    assert len(told) == 1
    assert WIRES == []


@tool(
    Wire,
    name="wire",
    requires_approval=True,
    decide_within=timedelta(hours=1),
    escalate_to=ApprovalPolicy(approvers=frozenset({"boss"})),
)
def escalating_wire(args: Wire, ctx: ToolContext) -> JsonValue:
    WIRES.append(args.amount)
    return {"sent": args.amount}


def _escalating() -> ToolAgent:
    return ToolAgent(
        name="payer",
        system_prompt="Pay.",
        model=ScriptedModel([call("wire", "w1", amount=70), reply("done")]),
        tool_list=[escalating_wire],
    )


def test_past_its_deadline_a_gate_goes_to_its_escalation_deciders(
    es_harness: Callable[[Any], AgentHarness], virtual_clock: VirtualClock
) -> None:
    h = es_harness(_escalating())
    run_id = h.start()
    h.run()
    virtual_clock.advance(3700)  # the first deadline passes: escalated
    h.run()
    state = h.state(run_id)
    assert state.status == "paused"
    assert "escalated:wire" in state.vars
    h.approve(run_id, by="clerk")  # anyone could before; now only the boss
    h.run()
    refused = [v for v in h.ports.book.for_run(run_id) if v.status == "refused"]
    assert [v.reason for v in refused] == ["'clerk' may not decide gate 'wire'"]
    assert WIRES == []
    h.approve(run_id, by="boss")
    h.run()
    assert WIRES == [70]
    assert h.state(run_id).status == "completed"


def test_nobody_deciding_after_the_escalation_either_rejects(
    es_harness: Callable[[Any], AgentHarness], virtual_clock: VirtualClock
) -> None:
    h = es_harness(_escalating())
    run_id = h.start()
    h.run()
    virtual_clock.advance(3700)
    h.run()
    virtual_clock.advance(3700)  # the escalation's deadline passes too
    h.run()
    state = h.state(run_id)
    assert state.status == "completed"
    assert json.loads(state.output_json or "") == {
        "rejected": "wire",
        "by": "(deadline)",
    }
    assert WIRES == []
