"""The step protocol's pure half: what a planner may ask for, and what a command does.

A planner is a pure function of the folded state: it returns the next ``Step``. The
worker turns a step into an intention event, makes it durable, acts, and records the
outcome. ``decide`` turns a command into the events it causes, or refuses it with a
reason a person can act on; the CLI and the worker run the same function.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, Protocol

from pydantic import JsonValue

from es_agents.core.budget import BUDGET_EXCEEDED, GRANTS_KEY
from es_agents.core.commands import (
    Approve,
    Cancel,
    ChildEnded,
    Command,
    FireTimer,
    ForkRun,
    ProvideInput,
    Reject,
    SendMessage,
    StartRun,
)
from es_agents.core.events import (
    ChildReturned,
    Event,
    Interrupted,
    MessageReceived,
    Resumed,
    RunCompleted,
    RunFailed,
    RunStarted,
    StatePatched,
)
from es_agents.core.flow import ADMITTED, QUEUED
from es_agents.core.fold import fold
from es_agents.core.state import AWAITING_MESSAGE, GATE_PREFIX, RunState
from es_agents.core.transcript import EMPTY_CHAIN, Conversation, canonical_bytes
from es_agents.errors import EsAgentsError

Message = dict[str, JsonValue]  # a message of the neutral transcript

# A tool as the model is told of it: name, description, parameters (JSON Schema).
ToolSpec = dict[str, JsonValue]


@dataclass(frozen=True)
class CallModel:
    messages: Sequence[Message]
    params: dict[str, JsonValue] = field(default_factory=dict)
    tools: Sequence[ToolSpec] = ()


@dataclass(frozen=True)
class CallTool:
    call_id: str
    tool: str
    args: dict[str, JsonValue]


@dataclass(frozen=True)
class CallTools:
    """Several tool calls at once: their intentions are appended together and the
    calls run concurrently, each with its own step, idempotency key and outcome."""

    calls: tuple[CallTool, ...]

    def __post_init__(self) -> None:
        if not self.calls:
            raise ValueError("CallTools needs at least one call")
        ids = [c.call_id for c in self.calls]
        if len(set(ids)) != len(ids):
            raise ValueError(f"CallTools: call ids repeat: {ids}")


@dataclass(frozen=True)
class PatchState:
    key: str
    value: JsonValue


@dataclass(frozen=True)
class Interrupt:
    reason: Literal[
        "awaiting_approval",
        "awaiting_input",
        "awaiting_message",
        "awaiting_children",
        "sleeping",
    ]
    gate: str | None = None
    detail: dict[str, JsonValue] = field(default_factory=dict)
    wake_at: datetime | None = None


@dataclass(frozen=True)
class Decline:
    """A call the model asked for that will not run (it was rejected at its gate):
    its result is ``error``, which the model reads; nothing else happens."""

    call_id: str
    error: str


@dataclass(frozen=True)
class Respond:
    """A call the model asked for that is answered without running anything (a
    person's answer to ``ask_human``): its result is ``result``."""

    call_id: str
    result: JsonValue


@dataclass(frozen=True)
class Finish:
    output: JsonValue


@dataclass(frozen=True)
class Fail:
    error: str
    kind: str = "error"


Step = (
    CallModel
    | CallTool
    | CallTools
    | Decline
    | Respond
    | PatchState
    | Interrupt
    | Finish
    | Fail
)


class Planner(Protocol):
    """Decides the next step from the folded state; must not do I/O."""

    def plan(self, state: RunState) -> Step: ...


def canonical_json(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def args_hash(args_json: str) -> str:
    """The hash of a call's arguments as JSON (key order does not matter): what an
    approval of the call approves."""
    try:
        text = canonical_json(json.loads(args_json))
    except json.JSONDecodeError:
        text = args_json
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def messages_hash(messages: Sequence[Message]) -> str:
    return "sha256:" + hashlib.sha256(canonical_bytes(list(messages))).hexdigest()


def request_hash(step: CallModel, model_id: str) -> str:
    """The hash of what a model call sends: the model, its tools and parameters,
    the leading messages, and the chain of the run's transcript after them (a
    ``Conversation``; any other sequence is all leading messages). Extending a
    stored chain costs the messages since the snapshot, not the conversation."""
    messages = step.messages
    tail: list[Message] = []
    if isinstance(messages, Conversation):
        head, chain, tail = messages.head, messages.transcript.chain(), messages.tail
    else:
        head, chain = list(messages), EMPTY_CHAIN
    header = {"model": model_id, "tools": list(step.tools), "params": step.params}
    text = b"es-agents request 2\n%s\n%s\n" % (
        canonical_bytes(header),
        canonical_bytes(head),
    )
    # Trailing messages only when there are some: other hashes stay as they were.
    after = b"\n%s" % canonical_bytes(tail) if tail else b""
    return "sha256:" + hashlib.sha256(text + chain + after).hexdigest()


DEADLINE = "(deadline)"  # who rejects a call nobody decided in time


class Refused(EsAgentsError):
    """A command that cannot apply to the run as it is; nothing was changed."""


class EventBuilder:
    """Makes a run's next events with contiguous sequence numbers and folds them."""

    def __init__(self, state: RunState) -> None:
        self.state = state
        self.events: list[Event] = []

    def add(self, event_type: type[Event], **fields: object) -> Event:
        fields.setdefault("step", self.state.step)
        event = event_type(run_id=self.state.run_id, seq=self.state.seq + 1, **fields)
        fold(self.state, event)
        self.events.append(event)
        return event


def start(
    command: StartRun, versions: dict[str, str | int] | None = None
) -> RunStarted:
    return RunStarted(
        run_id=command.run_id,
        seq=0,
        step=0,
        agent=command.agent,
        input_json=command.input_json,
        command_id=command.command_id,
        parent_run_id=command.parent_run_id,
        parent_call_id=command.parent_call_id,
        **(versions or {}),
    )


def decide(  # noqa: PLR0911, PLR0912 - one branch per command and verdict
    state: RunState | None, command: Command
) -> list[Event]:
    """The events ``command`` appends to the run in ``state`` (None: no such run).

    Returns ``[]`` for a command already applied. Raises ``Refused`` with the reason
    otherwise; a refusal changes nothing. ``state`` is updated with the new events.
    """
    if isinstance(command, StartRun | ForkRun):
        if state is not None:
            if command.command_id in state.command_ids:
                _same_as_applied(state, command)
                return []
            raise Refused(f"run {command.run_id} already exists")
        raise Refused(f"{command.wire_name} is applied by the agent's worker")
    if state is None:
        raise Refused(f"unknown run {command.run_id}")
    if command.command_id in state.command_ids or (
        isinstance(command, SendMessage) and command.command_id in state.message_ids
    ):
        _same_as_applied(state, command)
        return []
    if state.terminal:
        raise Refused(f"run {state.run_id} is {state.status}")
    out = EventBuilder(state)
    if isinstance(command, Approve | Reject):
        _decide_gate(state, command, out)
    elif isinstance(command, ProvideInput):
        # Input answers a question, or settles an uncertain effect with its result;
        # for a payload that was unavailable it says "restored: try again".
        if state.waiting is not None and state.waiting.reason == "payload_unavailable":
            out.add(
                Resumed, reason="retry", command_id=command.command_id, by=command.by
            )
            return out.events
        if state.waiting is None or state.waiting.reason not in (
            "awaiting_input",
            "uncertain_effect",
        ):
            raise Refused(
                f"run {state.run_id} is not waiting for input ({_doing(state)})"
            )
        out.add(
            Resumed,
            reason="input",
            command_id=command.command_id,
            by=command.by,
            input_json=command.input_json,
        )
    elif isinstance(command, SendMessage):
        _decide_message(state, command, out)
    elif isinstance(command, ChildEnded):
        _decide_child(state, command, out)
    elif isinstance(command, Cancel):
        out.add(
            RunFailed,
            error=f"cancelled by {command.by}: {command.reason or ''}",
            kind="cancelled",
        )
    elif isinstance(command, FireTimer):
        waiting = state.waiting
        if (
            waiting is None
            or waiting.reason not in ("sleeping", "awaiting_approval", QUEUED)
            or timer_id(state.run_id, waiting.since_seq) != command.timer_id
        ):
            return []  # a stale or repeated timer: nothing to wake
        if waiting.reason == "awaiting_approval":  # no decision by the deadline
            out.add(
                Resumed,
                reason="rejected",
                by=DEADLINE,
                command_id=command.command_id,
                args_hash=_approved_args(waiting.detail_json),
                input_json=canonical_json(
                    {"feedback": f"no decision by {command.due_at.isoformat()}"}
                ),
            )
            return out.events
        if waiting.reason == QUEUED:  # given a place (core.flow)
            out.add(Resumed, reason=ADMITTED, command_id=command.command_id)
            return out.events
        out.add(Resumed, reason="timer", command_id=command.command_id)
    else:
        raise Refused(f"unknown command {command.wire_name}")
    return out.events


def _decide_message(state: RunState, command: SendMessage, out: EventBuilder) -> None:
    """A thread's next message, or its end (the run completes with its last reply)."""
    if state.waiting is None or state.waiting.reason != AWAITING_MESSAGE:
        raise Refused(
            f"run {state.run_id} is not waiting for a message ({_doing(state)})"
            + ("" if state.thread else "; it is not a conversational run")
        )
    if command.end:
        if command.text:
            raise Refused("a message that ends the thread has no text: send it first")
        out.add(
            RunCompleted,
            output_json=canonical_json(
                {"answer": last_reply(state), "turns": state.turns}
            ),
        )
        return
    if not command.text.strip():
        raise Refused("the message is empty")
    out.add(
        MessageReceived, text=command.text, by=command.by, command_id=command.command_id
    )


def _decide_child(state: RunState, command: ChildEnded, out: EventBuilder) -> None:
    """A child run's end: the result of the call that started it."""
    if state.children.get(command.call_id) != command.child_run_id:
        raise Refused(
            f"run {state.run_id} has no open child run {command.child_run_id} "
            f"for call {command.call_id}"
        )
    out.add(
        ChildReturned,
        call_id=command.call_id,
        child_run_id=command.child_run_id,
        status=command.status,
        output_json=command.output_json,
        error=command.error,
        prompt_tokens=command.prompt_tokens,
        completion_tokens=command.completion_tokens,
        model_calls=command.model_calls,
        command_id=command.command_id,
    )


def child_ended(state: RunState) -> ChildEnded | None:
    """What a child run that ended tells its parent (None: it has no parent, or
    has not ended)."""
    if state.parent_run_id is None or state.parent_call_id is None:
        return None
    if not state.terminal:
        return None
    return ChildEnded(
        command_id=f"child-ended:{state.run_id}",
        run_id=state.parent_run_id,
        call_id=state.parent_call_id,
        child_run_id=state.run_id,
        status=state.status,
        output_json=state.output_json,
        error=state.error,
        prompt_tokens=state.prompt_tokens,
        completion_tokens=state.completion_tokens,
        model_calls=state.model_calls,
    )


def last_reply(state: RunState) -> JsonValue:
    """The content of the run's last assistant message (None: there is none)."""
    transcript = state.transcript
    for i in range(len(transcript) - 1, max(-1, len(transcript) - 4), -1):
        message = transcript[i]
        if message.get("role") == "assistant":
            return message.get("content")
    return None


def _same_as_applied(state: RunState, command: Command) -> None:
    """A resent command is a no-op; a command id reused for another body is refused.

    Compared with what the state keeps of the id: a start's agent and input, and a
    gate decided ahead of time (decision and author). A decision that resumed the
    run keeps only its id in the state, so a reuse of that id is a no-op.
    """
    differs: list[str] = []
    if isinstance(command, ForkRun) and (state.origin_run, state.origin_seq) != (
        command.origin_run,
        command.at_seq,
    ):
        differs.append(f"a fork of {state.origin_run}@{state.origin_seq}")
    if isinstance(command, StartRun):
        if command.agent != state.agent:
            differs.append(f"agent {command.agent!r}, not {state.agent!r}")
        if command.input_json != state.input_json:
            differs.append("another input")
    if isinstance(command, Approve | Reject):
        decision = "approved" if isinstance(command, Approve) else "rejected"
        for gate, early in state.early_decisions.items():
            if early.get("command_id") != command.command_id:
                continue
            if early.get("decision") != decision or early.get("by") != command.by:
                differs.append(
                    f"gate {gate!r} was {early.get('decision')} by {early.get('by')}"
                )
    if differs:
        raise Refused(
            f"command id {command.command_id!r} was already applied to run "
            f"{state.run_id} with another body ({'; '.join(differs)}); "
            "a new command needs a new id"
        )


def _decide_gate(state: RunState, command: Approve | Reject, out: EventBuilder) -> None:
    decision = "approved" if isinstance(command, Approve) else "rejected"
    waiting = state.waiting
    if waiting is not None and waiting.reason == BUDGET_EXCEEDED:
        _decide_budget(state, command, out)
        return
    if waiting is not None and waiting.reason == "awaiting_approval":
        if command.gate is not None and command.gate != waiting.gate:
            raise Refused(
                f"run {state.run_id} waits at gate {waiting.gate!r}, "
                f"not {command.gate!r}"
            )
        given: str | None = None  # what the decision gives the run, if anything
        approved = _approved_args(waiting.detail_json)
        if isinstance(command, Reject) and command.reason:
            # A rejection's reason, for the model when the tool tells it.
            given = canonical_json({"feedback": command.reason})
        elif isinstance(command, Approve) and command.args_json is not None:
            given = _edited_args(state, waiting.detail_json, command.args_json)
            approved = args_hash(given)
        signed = isinstance(command, Approve) and command.signature is not None
        out.add(
            Resumed,
            reason=decision,
            command_id=command.command_id,
            by=command.by,
            args_hash=approved,
            input_json=given,
            **(  # kept, so that the approval can be verified again before it acts
                {
                    "key_id": command.key_id,
                    "signature": command.signature,
                    "expires_at": command.expires_at,
                }
                if signed
                else {}
            ),
        )
        return
    if state.status != "running":
        raise Refused(
            f"run {state.run_id} is not waiting for approval ({_doing(state)})"
        )
    if command.gate is None:
        raise Refused(
            f"run {state.run_id} is not waiting for approval ({_doing(state)}); "
            "name the gate (--gate) to decide it ahead of time"
        )
    earlier = state.early_decisions.get(command.gate)
    if earlier is not None:
        raise Refused(
            f"gate {command.gate!r} of run {state.run_id} was already "
            f"{earlier.get('decision')} by {earlier.get('by')}"
        )
    out.add(
        StatePatched,
        key=GATE_PREFIX + command.gate,
        value_json=canonical_json(
            {"decision": decision, "by": command.by, "command_id": command.command_id}
        ),
    )


def _decide_budget(
    state: RunState, command: Approve | Reject, out: EventBuilder
) -> None:
    """At a budget pause: an approval grants the run as much again of every limit;
    a rejection ends it (``budget_exceeded``)."""
    if command.gate is not None:
        raise Refused(
            f"run {state.run_id} waits for a decision on its budget, not at gate "
            f"{command.gate!r} (decide without --gate)"
        )
    decision = "approved" if isinstance(command, Approve) else "rejected"
    out.add(Resumed, reason=decision, command_id=command.command_id, by=command.by)
    if isinstance(command, Approve):
        grants = state.vars.get(GRANTS_KEY)
        more = (grants if isinstance(grants, int) else 0) + 1
        out.add(StatePatched, key=GRANTS_KEY, value_json=canonical_json(more))
        return
    why = f"budget exceeded; {command.by} decided to stop"
    reason = getattr(command, "reason", None)
    out.add(
        RunFailed, error=why + (f": {reason}" if reason else ""), kind=BUDGET_EXCEEDED
    )


def _edited_args(state: RunState, detail_json: str, args_json: str) -> str:
    """An approval's edited arguments, checked: the pause asks about a call, and
    they are a JSON object (the tool checks them against its schema when called)."""
    try:
        detail = json.loads(detail_json or "{}")
    except json.JSONDecodeError:
        detail = {}
    if not isinstance(detail, dict) or not isinstance(detail.get("call_id"), str):
        raise Refused(
            f"run {state.run_id} waits at a gate that asks about no tool call: "
            "there are no arguments to edit"
        )
    try:
        args = json.loads(args_json)
    except json.JSONDecodeError as e:
        raise Refused(f"the edited arguments are not JSON: {e}") from e
    if not isinstance(args, dict):
        raise Refused("the edited arguments must be a JSON object")
    return canonical_json(args)


def _approved_args(detail_json: str) -> str | None:
    """The hash of the arguments of the call a gate's pause asks about, if any."""
    try:
        detail = json.loads(detail_json or "{}")
    except json.JSONDecodeError:
        return None
    raw = detail.get("args_json") if isinstance(detail, dict) else None
    return args_hash(raw) if isinstance(raw, str) else None


def _doing(state: RunState) -> str:
    if state.waiting is not None:
        return f"it waits: {state.waiting.reason}"
    return f"it is {state.status}"


def timer_id(run_id: str, interrupted_seq: int) -> str:
    """One timer per sleep: the run and the seq of its ``interrupted`` event."""
    return f"{run_id}:{interrupted_seq}"


def pass_gate(state: RunState, gate: str, out: EventBuilder) -> bool:
    """At a gate decided ahead of time, record the pause and the decision at once."""
    early = state.early_decisions.get(gate)
    if early is None:
        return False
    out.add(
        Interrupted,
        reason="awaiting_approval",
        detail_json=canonical_json({"gate": gate}),
    )
    by = early.get("by")
    command_id = early.get("command_id")
    out.add(
        Resumed,
        reason=str(early.get("decision")),
        by=by if isinstance(by, str) else None,
        command_id=command_id if isinstance(command_id, str) else None,
    )
    out.add(StatePatched, key=GATE_PREFIX + gate, value_json="null")
    return True
