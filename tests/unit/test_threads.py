"""Threads: a conversational agent waits as a row for the next message after each
reply, and the next turn continues the same transcript; a message the run cannot
take is refused; the turn budget ends the thread; a crash around a message loses
nothing and asks the model nothing twice."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from pydantic import BaseModel, JsonValue

from es_agents.agent import ToolAgent
from es_agents.core.budget import Budget
from es_agents.core.commands import SendMessage
from es_agents.core.events import MessageReceived, RunCompleted
from es_agents.core.snapshot import from_snapshot, to_snapshot
from es_agents.core.state import AWAITING_MESSAGE, RunState
from es_agents.core.step import Refused, decide
from es_agents.models import Completion, ScriptedModel, call, reply
from es_agents.testing import AgentHarness, Crashed
from es_agents.tools import ToolContext, tool

REFUNDS: list[str] = []
SEEN: list[list[str]] = []  # the user messages the model saw, per call


class Refund(BaseModel):
    order: int


@tool(Refund, name="refund", requires_approval=True)
def refund(args: Refund, ctx: ToolContext) -> JsonValue:
    REFUNDS.append(ctx.idempotency_key)
    return {"refunded": args.order}


def _seeing(answer: Completion) -> Callable[[Sequence[dict[str, Any]]], Completion]:
    def answer_(messages: Sequence[dict[str, Any]]) -> Completion:
        SEEN.append([str(m["content"]) for m in messages if m.get("role") == "user"])
        return answer

    return answer_


def _desk() -> ToolAgent:
    script = [
        _seeing(reply("Hello! How can I help?")),
        _seeing(call("refund", "r1", order=7)),
        _seeing(reply("Order 7 is refunded.")),
        _seeing(reply("You're welcome.")),
    ]
    return ToolAgent(
        name="desk",
        system_prompt="You are a support desk.",
        model=ScriptedModel(script),
        tool_list=[refund],
        conversational=True,
    )


def _waits(state: RunState) -> str | None:
    return state.waiting.reason if state.waiting is not None else None


@pytest.fixture(autouse=True)
def _clear() -> None:
    REFUNDS.clear()
    SEEN.clear()


def test_a_thread_waits_for_each_message_and_keeps_its_transcript(
    es_harness: Callable[[Any], AgentHarness],
) -> None:
    h = es_harness(_desk())
    run_id = h.start(json.dumps("hi"))
    h.run()
    state = h.state(run_id)
    assert state.status == "paused"
    assert _waits(state) == AWAITING_MESSAGE
    assert state.thread
    assert state.turns == 0

    h.send_message(run_id, "Please refund order 7", by="ann")
    h.run()
    state = h.state(run_id)
    assert _waits(state) == "awaiting_approval"
    h.approve(run_id)
    h.run()
    state = h.state(run_id)
    assert _waits(state) == AWAITING_MESSAGE
    assert state.turns == 1
    assert len(REFUNDS) == 1
    # The model's third call saw the input and the message, in order.
    assert SEEN[-1] == ['"hi"', "Please refund order 7"]

    h.send_message(run_id, "Thanks!", by="ann")
    h.run()
    assert SEEN[-1] == ['"hi"', "Please refund order 7", "Thanks!"]
    h.send_message(run_id, "", by="ann", end=True)
    h.run()
    state = h.state(run_id)
    assert state.status == "completed"
    assert json.loads(state.output_json or "") == {
        "answer": "You're welcome.",
        "turns": 2,
    }
    received = [e for e in h.events(run_id) if isinstance(e, MessageReceived)]
    assert [(e.text, e.by) for e in received] == [
        ("Please refund order 7", "ann"),
        ("Thanks!", "ann"),
    ]
    assert len(REFUNDS) == 1
    assert len(SEEN) == 4  # one model call per answer, none asked twice


def test_messages_the_run_cannot_take_are_refused(
    es_harness: Callable[[Any], AgentHarness],
) -> None:
    h = es_harness(_desk())
    run_id = h.start(json.dumps("hi"))
    h.run()
    state = h.state(run_id)

    def refused(command: SendMessage) -> str:
        with pytest.raises(Refused) as e:
            decide(state, command)
        return str(e.value)

    assert "empty" in refused(SendMessage(run_id=run_id, by="a", text="  "))
    assert "no text" in refused(SendMessage(run_id=run_id, by="a", text="x", end=True))
    h.send_message(run_id, "refund 7", by="ann")
    h.run()  # now it waits for an approval, not a message
    waiting = h.state(run_id)
    with pytest.raises(Refused, match="not waiting for a message"):
        decide(waiting, SendMessage(run_id=run_id, by="a", text="more"))

    plain = es_harness(
        ToolAgent(name="plain", system_prompt="s", model=ScriptedModel([reply("ok")]))
    )
    done = plain.start()
    plain.run()
    state = plain.state(done)
    assert state.status == "completed"
    with pytest.raises(Refused, match="completed"):
        decide(state, SendMessage(run_id=done, by="a", text="more"))


def test_the_turn_budget_ends_the_thread_after_the_last_answer(
    es_harness: Callable[[Any], AgentHarness],
) -> None:
    agent = ToolAgent(
        name="chat",
        system_prompt="Chat.",
        model=ScriptedModel([reply(f"answer {n}") for n in range(10)]),
        conversational=True,
        budget=Budget(max_turns=2),
    )
    h = es_harness(agent)
    run_id = h.start(json.dumps("hi"))
    h.run()
    for text in ("one", "two"):
        assert h.state(run_id).status == "paused"
        h.send_message(run_id, text)
        h.run()
    state = h.state(run_id)
    assert state.status == "completed"
    assert json.loads(state.output_json or "") == {
        "answer": "answer 2",
        "turns": 2,
        "ended": "turns",
    }
    assert state.model_calls == 3


@pytest.mark.parametrize(
    "point", ["after_append:message_received", "after_append:model_call_requested"]
)
def test_a_crash_around_a_message_loses_nothing_and_asks_once(
    es_harness: Callable[[Any], AgentHarness], point: str
) -> None:
    h = es_harness(_desk())
    run_id = h.start(json.dumps("hi"))
    h.run()
    h.send_message(run_id, "refund 7", by="ann")
    with pytest.raises(Crashed):
        h.run(crash_at=point)
    h.run()  # recovers
    state = h.state(run_id)
    assert _waits(state) == "awaiting_approval"
    assert state.turns == 1
    assert state.model_calls == 2
    ended = [e for e in h.events(run_id) if isinstance(e, RunCompleted)]
    assert not ended


def test_a_snapshot_keeps_the_turns_and_the_thread() -> None:
    state = RunState(run_id="r", turns=3)
    again = from_snapshot(to_snapshot(state))
    assert again.turns == 3
    assert "turns" not in to_snapshot(RunState(run_id="r"))  # unchanged for others


def test_snapshots_stay_flat_in_the_number_of_turns(
    es_harness: Callable[[Any], AgentHarness],
) -> None:
    agent = ToolAgent(
        name="chat",
        system_prompt="Chat.",
        model=ScriptedModel([reply(f"a{n}") for n in range(400)]),
        conversational=True,
        budget=Budget(max_model_calls=None),
    )
    h = es_harness(agent)
    run_id = h.start(json.dumps("hi"))
    h.run()
    sizes = {}
    sent = []
    for turn in range(1, 121):
        command = SendMessage(run_id=run_id, by="ann", text=f"m{turn}")
        sent.append(command)
        h.ports.log.send(command)
        h.run()
        if turn in (40, 120):
            snapshot = to_snapshot(h.state(run_id), inline=False)
            sizes[turn] = len(json.dumps(snapshot))
    state = h.state(run_id)
    assert state.turns == 120
    assert sizes[120] - sizes[40] < 16, sizes  # a few digits more, no more
    # The last message sent again (its offset not committed): nothing changes.
    h.ports.log.send(sent[-1])
    h.run()
    assert h.state(run_id).seq == state.seq


class Wire(BaseModel):
    amount: int


@tool(Wire, name="wire", requires_approval=True, on_reject="tell_model")
def wire(args: Wire, ctx: ToolContext) -> JsonValue:
    REFUNDS.append(f"wire {args.amount}")
    return {"wired": args.amount}


def test_a_rejection_with_a_reason_goes_back_to_the_model(
    es_harness: Callable[[Any], AgentHarness],
) -> None:
    told: list[str] = []

    def after(messages: Sequence[dict[str, Any]]) -> Completion:
        told.append(str(messages[-1]["content"]))
        return call("wire", "w2", amount=100)

    agent = ToolAgent(
        name="payer",
        system_prompt="Pay.",
        model=ScriptedModel(
            [call("wire", "w1", amount=5000), after, reply("Paid 100.")]
        ),
        tool_list=[wire],
    )
    h = es_harness(agent)
    run_id = h.start()
    h.run()
    assert _waits(h.state(run_id)) == "awaiting_approval"
    h.reject(run_id, by="lead", reason="over the limit of 1000")
    h.run()
    # The model read who rejected the call and why, and asked again; nothing ran.
    assert told == [
        "error: rejected by lead: the call did not run. Reason: over the limit of 1000"
    ]
    assert REFUNDS == []
    state = h.state(run_id)
    assert _waits(state) == "awaiting_approval"
    assert state.tool_calls == 0  # a declined call is not a call
    h.approve(run_id, by="lead")
    h.run()
    state = h.state(run_id)
    assert state.status == "completed"
    assert REFUNDS == ["wire 100"]
    assert json.loads(state.output_json or "") == {"answer": "Paid 100."}


def test_a_rejection_ends_the_run_by_default(
    es_harness: Callable[[Any], AgentHarness],
) -> None:
    h = es_harness(_desk())
    run_id = h.start(json.dumps("hi"))
    h.run()
    h.send_message(run_id, "refund 7")
    h.run()
    h.reject(run_id, by="lead", reason="no")
    h.run()
    state = h.state(run_id)
    assert state.status == "completed"
    assert json.loads(state.output_json or "") == {"rejected": "refund", "by": "lead"}
    assert REFUNDS == []
