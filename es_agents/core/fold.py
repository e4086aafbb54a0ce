"""The fold: state after a prefix of the log is ``fold`` over that prefix.

``fold(state, event)`` applies one event. It updates ``state`` in place and returns it,
so folding ten thousand events costs ten thousand small updates instead of ten thousand
copies; ``replay`` starts from a fresh or a copied state, so callers that keep the
state they pass in use ``replay``.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from functools import singledispatch

from pydantic import JsonValue

from es_agents.core.events import (
    ApprovalRecorded,
    ChildReturned,
    DecisionRefused,
    Event,
    Forked,
    Interrupted,
    MessageReceived,
    Migrated,
    ModelCallRequested,
    ModelResponded,
    Resumed,
    RunCompleted,
    RunFailed,
    RunStarted,
    StatePatched,
    ToolCall,
    ToolCallRequested,
    ToolReturned,
)
from es_agents.core.state import (
    AWAITING_CHILDREN,
    AWAITING_MESSAGE,
    CHILD_PREFIX,
    GATE_PREFIX,
    MESSAGE_IDS_KEPT,
    LastResume,
    PendingModelCall,
    PendingToolCall,
    RunState,
    Versions,
    Waiting,
)
from es_agents.errors import FoldError


def fold(state: RunState, event: Event) -> RunState:
    if event.run_id != state.run_id:
        raise FoldError(
            f"event {event.event_id} of run {event.run_id} "
            f"folded into run {state.run_id}"
        )
    if event.seq != state.seq + 1:
        raise FoldError(
            f"run {state.run_id}: expected seq {state.seq + 1}, got {event.seq} "
            f"({event.wire_name} {event.event_id})"
        )
    if state.terminal:
        raise FoldError(f"run {state.run_id} is {state.status}; got {event.wire_name}")
    _apply(event, state)
    state.seq = event.seq
    state.step = max(state.step, event.step)
    state.updated_at = event.at
    return state


def replay(events: Iterable[Event], start: RunState | None = None) -> RunState:
    """Fold ``events`` onto a copy of ``start`` (or onto a new state)."""
    iterator = iter(events)
    if start is None:
        first = next(iterator, None)
        if first is None:
            raise FoldError("cannot replay an empty log without a starting state")
        state = fold(RunState(run_id=first.run_id), first)
    else:
        state = copy.deepcopy(start)
    for event in iterator:
        fold(state, event)
    return state


def _require_running(state: RunState, event: Event) -> None:
    if state.status != "running":
        raise FoldError(
            f"run {state.run_id} is {state.status}; {event.wire_name} needs running"
        )


@singledispatch
def _apply(event: Event, state: RunState) -> None:
    raise FoldError(f"no fold rule for {type(event).__name__}")


@_apply.register
def _(event: RunStarted, state: RunState) -> None:
    if event.seq != 0:
        raise FoldError(f"run {state.run_id}: run_started must be seq 0")
    state.agent = event.agent
    state.input_json = event.input_json
    state.command_ids.add(event.command_id)
    state.status = "running"
    state.started_at = event.at
    state.versions = Versions(
        agent_version=event.agent_version,
        code_revision=event.code_revision,
        prompt_hash=event.prompt_hash,
        model_id=event.model_id,
        tools_hash=event.tools_hash,
        reducer_version=event.reducer_version,
    )
    state.parent_run_id = event.parent_run_id
    state.parent_call_id = event.parent_call_id


def _require_started(state: RunState, event: Event) -> None:
    if state.seq < 0:
        raise FoldError(f"run {state.run_id}: {event.wire_name} before run_started")


@_apply.register
def _(event: ModelCallRequested, state: RunState) -> None:
    _require_started(state, event)
    _require_running(state, event)
    if state.pending_tools:
        raise FoldError(f"run {state.run_id}: model call while a tool call is pending")
    state.pending = PendingModelCall(
        step=event.step,
        seq=event.seq,
        messages_hash=event.messages_hash,
        attempt=event.attempt,
    )
    state.model_attempts += 1


@_apply.register
def _(event: ModelResponded, state: RunState) -> None:
    if not isinstance(state.pending, PendingModelCall):
        raise FoldError(f"run {state.run_id}: model_responded without a request")
    state.pending = None
    state.model_calls += 1
    state.prompt_tokens += event.usage.prompt_tokens
    state.completion_tokens += event.usage.completion_tokens
    message: dict[str, object] = {"role": "assistant", "content": event.content}
    if event.tool_calls:
        message["tool_calls"] = [c.model_dump() for c in event.tool_calls]
    state.transcript.append(message)  # type: ignore[arg-type]
    state.open_tool_calls = list(event.tool_calls)
    state.last_outcome_seq = event.seq


@_apply.register
def _(event: ToolCallRequested, state: RunState) -> None:
    _require_started(state, event)
    _require_running(state, event)
    if isinstance(state.pending, PendingModelCall):
        raise FoldError(f"run {state.run_id}: tool call while a model call is pending")
    if any(p.call_id == event.call_id for p in state.pending_tools):
        raise FoldError(
            f"run {state.run_id}: tool call {event.call_id} requested twice"
        )
    # Several tool calls may be in flight at once (requested together, run
    # concurrently); ``pending`` names the earliest.
    call = PendingToolCall(
        step=event.step,
        seq=event.seq,
        call_id=event.call_id,
        tool=event.tool,
        args_json=event.args_json,
        idempotency_key=event.idempotency_key,
        side_effect=event.side_effect,
    )
    state.pending_tools.append(call)
    state.pending = state.pending_tools[0]


@_apply.register
def _(event: ToolReturned, state: RunState) -> None:
    pending = next((p for p in state.pending_tools if p.call_id == event.call_id), None)
    name: str
    if pending is not None:
        state.pending_tools.remove(pending)
        state.pending = state.pending_tools[0] if state.pending_tools else None
        state.tool_calls += 1
        if event.reconciled:
            state.reconciled_calls += 1
        name = pending.tool
    else:
        # A call settled without running: declined at its gate (an error) or
        # answered by a person (``ask_human``); nothing was requested.
        asked = next(
            (c for c in state.open_tool_calls if c.call_id == event.call_id), None
        )
        if asked is None or event.reconciled:
            raise FoldError(
                f"run {state.run_id}: tool_returned for {event.call_id} without its "
                "request"
            )
        name = asked.name
    content = event.result_json if event.error is None else f"error: {event.error}"
    _answered(state, event, event.call_id, name, content)


def _answered(
    state: RunState, event: Event, call_id: str, name: str, content: str | None
) -> None:
    """A call the model asked for has its result: closed, and read next."""
    state.last_outcome_seq = event.seq
    state.open_tool_calls = [c for c in state.open_tool_calls if c.call_id != call_id]
    state.transcript.append(
        {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}
    )


@_apply.register
def _(event: StatePatched, state: RunState) -> None:
    _require_started(state, event)
    value = json.loads(event.value_json)
    if event.key.startswith(GATE_PREFIX):
        gate = event.key[len(GATE_PREFIX) :]
        if value is None:
            state.early_decisions.pop(gate, None)
        elif isinstance(value, dict):
            state.early_decisions[gate] = value
            command_id = value.get("command_id")
            if isinstance(command_id, str):
                state.command_ids.add(command_id)
        else:
            raise FoldError(f"run {state.run_id}: {event.key} must hold an object")
        return
    if event.key.startswith(CHILD_PREFIX):  # a call's child run started
        _child_started(state, event.key[len(CHILD_PREFIX) :], value)
    state.vars[event.key] = value


def _child_started(state: RunState, call_id: str, child: JsonValue) -> None:
    """The call's effect is done (the child run is started): no longer in flight;
    it stays open until the child ends (``child_returned``)."""
    pending = next((p for p in state.pending_tools if p.call_id == call_id), None)
    if pending is None or not isinstance(child, str):
        raise FoldError(
            f"run {state.run_id}: child run for {call_id} without its request"
        )
    state.pending_tools.remove(pending)
    state.pending = state.pending_tools[0] if state.pending_tools else None
    state.tool_calls += 1


@_apply.register
def _(event: ChildReturned, state: RunState) -> None:
    _require_started(state, event)
    key = CHILD_PREFIX + event.call_id
    if state.vars.get(key) != event.child_run_id:
        raise FoldError(
            f"run {state.run_id}: child_returned for {event.call_id}: no child "
            f"run {event.child_run_id} is open for it"
        )
    del state.vars[key]
    state.command_ids.add(event.command_id)
    state.prompt_tokens += event.prompt_tokens
    state.completion_tokens += event.completion_tokens
    state.model_calls += event.model_calls
    name = next(
        (c.name for c in state.open_tool_calls if c.call_id == event.call_id), ""
    )
    content = (
        (event.output_json or "null")
        if event.status == "completed"
        else f"error: child run {event.child_run_id} {event.status}: {event.error}"
    )
    _answered(state, event, event.call_id, name, content)
    waiting = state.waiting
    if (
        state.status == "paused"
        and waiting is not None
        and waiting.reason == AWAITING_CHILDREN
        and not state.children
    ):
        state.status = "running"
        state.waiting = None


@_apply.register
def _(event: Interrupted, state: RunState) -> None:
    _require_started(state, event)
    _require_running(state, event)
    state.status = "blocked" if event.reason == "version_mismatch" else "paused"
    detail = json.loads(event.detail_json or "{}")
    gate = detail.get("gate") if isinstance(detail, dict) else None
    if event.reason == "version_mismatch" and isinstance(detail, dict):
        state.last_gate = detail
    state.waiting = Waiting(
        reason=event.reason,
        detail_json=event.detail_json,
        wake_at=event.wake_at,
        since_seq=event.seq,
        gate=gate if isinstance(gate, str) else None,
    )


@_apply.register
def _(event: Resumed, state: RunState) -> None:
    if state.status not in ("paused", "blocked"):
        raise FoldError(f"run {state.run_id} is {state.status}; cannot resume")
    waiting = state.waiting
    gate = waiting.gate if waiting is not None else None
    signed: list[JsonValue] = []
    if waiting is not None and gate is not None:
        signed = list(waiting.signed)
        if event.signature is not None and event.key_id is not None:
            signed.append(_evidence(state, waiting, event, event.key_id))
    if event.reason == "approved" and event.input_json and waiting is not None:
        _edit_call(state, waiting.detail_json, event.input_json)
    state.status = "running"
    state.waiting = None
    state.last_resume = LastResume(
        reason=event.reason,
        by=event.by,
        input_json=event.input_json,
        seq=event.seq,
        gate=gate,
    )
    if gate is not None:
        state.gate_decisions[gate] = {
            "reason": event.reason,
            "by": event.by,
            "seq": event.seq,
            **({"args_hash": event.args_hash} if event.args_hash else {}),
            **({"input_json": event.input_json} if event.input_json else {}),
            **({"signed": signed} if signed else {}),
        }
    if event.command_id is not None:
        state.command_ids.add(event.command_id)


@_apply.register
def _(event: MessageReceived, state: RunState) -> None:
    waiting = state.waiting
    if (
        state.status != "paused"
        or waiting is None
        or waiting.reason != AWAITING_MESSAGE
    ):
        raise FoldError(f"run {state.run_id} does not wait for a message")
    state.status = "running"
    state.waiting = None
    state.turns += 1
    state.last_outcome_seq = event.seq
    state.last_resume = LastResume(
        reason="message", by=event.by, input_json=None, seq=event.seq
    )
    state.message_ids = [*state.message_ids[1 - MESSAGE_IDS_KEPT :], event.command_id]
    state.transcript.append({"role": "user", "content": event.text})


def _edit_call(state: RunState, detail_json: str, args_json: str) -> None:
    """An approval with edited arguments: the call the pause asked about runs with
    them (the model's original call stays in the transcript and the log)."""
    detail = json.loads(detail_json or "{}")
    call_id = detail.get("call_id") if isinstance(detail, dict) else None
    for i, call in enumerate(state.open_tool_calls):
        if call.call_id == call_id:
            state.open_tool_calls[i] = ToolCall(
                call_id=call.call_id, name=call.name, args_json=args_json
            )
            return
    raise FoldError(f"run {state.run_id}: edited arguments for no open call")


@_apply.register
def _(event: RunCompleted, state: RunState) -> None:
    _require_started(state, event)
    state.status = "completed"
    state.output_json = event.output_json
    state.pending = None
    state.pending_tools = []
    state.waiting = None


@_apply.register
def _(event: RunFailed, state: RunState) -> None:
    _require_started(state, event)
    state.status = "cancelled" if event.kind == "cancelled" else "failed"
    state.error = event.error
    state.pending = None
    state.pending_tools = []
    state.waiting = None


@_apply.register
def _(event: Migrated, state: RunState) -> None:
    _require_started(state, event)
    state.migrations.append((event.from_version, event.to_version))
    changes = json.loads(event.changes_json or "{}")
    if isinstance(changes, dict):
        state.last_gate = changes
        versions = changes.get("versions")
        if isinstance(versions, dict):
            state.versions = Versions(**versions)


@_apply.register
def _(event: Forked, state: RunState) -> None:
    _require_started(state, event)
    state.origin_run = event.origin_run  # a fork of a fork names its own origin
    state.origin_seq = event.origin_seq
    state.command_ids.add(event.command_id)


@_apply.register
def _(event: ApprovalRecorded, state: RunState) -> None:
    _require_started(state, event)
    waiting = state.waiting
    if waiting is None or waiting.reason != "awaiting_approval":
        raise FoldError(f"run {state.run_id} does not wait for an approval")
    waiting.approvals.append(event.by)
    if event.signature is not None and event.key_id is not None:
        waiting.signed.append(_evidence(state, waiting, event, event.key_id))
    state.command_ids.add(event.command_id)


def _evidence(
    state: RunState,
    waiting: Waiting,
    event: Resumed | ApprovalRecorded,
    key_id: str,
) -> dict[str, JsonValue]:
    """What verifying a signed approval again takes: the pause it answered (its
    step and the ``interrupted`` event's seq), who signed with which key, what it
    signed, and when the decision was appended (before it expired)."""
    return {
        "by": event.by,
        "key_id": key_id,
        "signature": (event.signature or b"").hex(),
        "expires_at": event.expires_at.isoformat() if event.expires_at else None,
        "args_hash": event.args_hash,
        "step": state.step,
        "seq": waiting.since_seq,
        "at": event.at.isoformat(),
    }


@_apply.register
def _(event: DecisionRefused, state: RunState) -> None:
    _require_started(state, event)  # a record only: resent, it is judged again
    if state.waiting is not None:
        state.waiting.refusals += 1
