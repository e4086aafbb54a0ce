"""Replay that checks: a run's events from the log, re-folded by this code, told as a
timeline, and compared with the projection.

The log is the record and the projection a view of it. ``check_run`` folds the whole
log, then checks the ``runs`` row against the fold of the log up to the row's
``last_seq`` (a projector that is behind is not wrong), and the latest snapshot
against the fold up to the snapshot's seq. The first differing field is reported.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from es_agents.core.chain import ChainCheck
from es_agents.core.events import (
    ApprovalRecorded,
    ChildReturned,
    DecisionRefused,
    Event,
    Forked,
    Interrupted,
    Migrated,
    ModelCallRequested,
    ModelResponded,
    Resumed,
    RunCompleted,
    RunFailed,
    RunStarted,
    StatePatched,
    ToolCallRequested,
    ToolReturned,
)
from es_agents.core.fold import fold
from es_agents.core.run_row import run_row
from es_agents.core.snapshot import to_snapshot
from es_agents.core.state import CHILD_PREFIX, RunState
from es_agents.errors import DecodeError, EsAgentsError
from es_agents.ports import EventLog, Projections
from es_agents.settings import ModelPrice

SHORT = 120


@dataclass
class RunCheck:
    """What ``replay`` found: the timeline, the fold, and how the projection agrees."""

    run_id: str
    events: list[Event]
    timeline: list[dict[str, object]]
    state: RunState | None
    mismatch: str | None = None  # the first differing field, with both values
    notes: list[str] = field(default_factory=list)
    chain: list[str] = field(default_factory=list)  # where the hash chain breaks
    head: str = ""  # hex digest of the last event's bytes

    @property
    def consistent(self) -> bool:
        return self.state is not None and self.mismatch is None


def check_run(  # noqa: PLR0911 - one return per way the check ends
    log: EventLog,
    projections: Projections,
    run_id: str,
    prices: Mapping[str, ModelPrice],
    reveal: Callable[[Event], Event] | None = None,
) -> RunCheck:
    """Fold the run's log and compare the projection with it; ``reveal`` decrypts
    encrypted payloads for the timeline (the checks use the events as written)."""
    try:  # claim-checked payloads read back, hash-checked
        sealed = log.read_sealed(run_id)
    except DecodeError as e:
        return RunCheck(run_id, [], [], None, mismatch=f"the log does not decode: {e}")
    events = [s.event for s in sealed]
    shown = [reveal(e) for e in events] if reveal is not None else events
    check = RunCheck(run_id, events, timeline(shown, prices), None)
    if not events:
        return check
    chain = ChainCheck(run_id, keep_heads=True)
    check.chain = [p for s in sealed if (p := chain.add(s.event, s.value))]
    check.head = chain.head.hex()
    if check.chain:
        check.mismatch = f"tampered log: {check.chain[0]}"
        return check
    states = _folds(events)  # the state after each seq
    try:
        check.state = states[events[-1].seq]
    except KeyError:
        check.mismatch = "the log does not fold (see the timeline's last entry)"
        return check
    row = projections.run_row(run_id)
    if row is None:
        check.notes.append("not projected (yet): no runs row")
    else:
        seq = int(str(row["last_seq"]))
        if seq not in states:
            check.mismatch = (
                f"runs.last_seq: projection {seq}, log ends at {check.state.seq}"
            )
            return check
        if seq < check.state.seq:
            check.notes.append(f"projection behind: at seq {seq} of {check.state.seq}")
        columns = dict(row)
        check.mismatch = head_difference(columns.pop("head", None), chain.heads[seq])
        if check.mismatch is None:
            check.mismatch = first_difference(
                "runs", columns, run_row(states[seq]), projection_first=True
            )
        if check.mismatch is not None:
            return check
    snapshot = projections.latest_snapshot(run_id)
    if snapshot is None:
        check.notes.append("no snapshot")
        return check
    seq, stored = snapshot
    if seq not in states:
        check.mismatch = f"run_snapshots.seq {seq} is not in the log"
        return check
    folded = json.loads(json.dumps(to_snapshot(states[seq]), default=str))
    check.mismatch = first_difference(
        f"run_snapshots@{seq}", stored, folded, projection_first=True
    )
    return check


def head_difference(projected: object, logged: bytes) -> str | None:
    """The ``runs`` row's chain head against the log's (a projection from before
    the head was kept has none)."""
    if not projected or projected == logged.hex():
        return None
    return (
        f"runs.head: projection {str(projected)[:16]}..., log {logged.hex()[:16]}...: "
        "the log's last event is not the one projected (tampered)"
    )


def _folds(events: Sequence[Event]) -> dict[int, RunState]:
    out: dict[int, RunState] = {}
    state = RunState(run_id=events[0].run_id)
    for event in events:
        try:
            state = fold(state, event)
        except EsAgentsError:
            break
        out[event.seq] = copy.deepcopy(state)
    return out


def first_difference(  # noqa: PLR0911 - one return per shape
    path: str, projected: object, folded: object, projection_first: bool
) -> str | None:
    if isinstance(projected, dict) and isinstance(folded, dict):
        for key in sorted(set(projected) | set(folded), key=str):
            found = first_difference(
                f"{path}.{key}", projected.get(key), folded.get(key), projection_first
            )
            if found is not None:
                return found
        return None
    if isinstance(projected, list) and isinstance(folded, list):
        if len(projected) != len(folded):
            return f"{path}: projection has {len(projected)} items, log {len(folded)}"
        for i, (a, b) in enumerate(zip(projected, folded, strict=True)):
            found = first_difference(f"{path}[{i}]", a, b, projection_first)
            if found is not None:
                return found
        return None
    if _same(projected, folded):
        return None
    return f"{path}: projection {projected!r}, log {folded!r}"


def _same(a: object, b: object) -> bool:
    if isinstance(a, datetime) and isinstance(b, datetime):
        return a == b
    return a == b or (a is not None and b is not None and str(a) == str(b))


# -- the timeline -------------------------------------------------------------------
def timeline(
    events: Sequence[Event], prices: Mapping[str, ModelPrice]
) -> list[dict[str, object]]:
    """One entry per event, with what an auditor asks of it."""
    requested: dict[int, ModelCallRequested] = {}
    out = []
    for event in events:
        entry: dict[str, object] = {
            "seq": event.seq,
            "step": event.step,
            "type": event.wire_name,
            "at": event.at.isoformat(),
        }
        entry.update(_details(event, requested, prices))
        claims = getattr(event, "claims", ())
        if claims:
            entry["payloads"] = [
                {"field": c.field, "sha256": c.sha256, "size": c.size, "key": c.key}
                for c in claims
            ]
        out.append(entry)
    return out


def _details(  # noqa: PLR0911, PLR0912 - one return per event type
    event: Event,
    requested: dict[int, ModelCallRequested],
    prices: Mapping[str, ModelPrice],
) -> dict[str, object]:
    if isinstance(event, RunStarted):
        return {
            "agent": event.agent,
            "agent_version": event.agent_version,
            "parent": event.parent_run_id,
        }
    if isinstance(event, ChildReturned):
        return {
            "child": event.child_run_id,
            "status": event.status,
            "output": _short(event.output_json),
            "error": _short(event.error),
            "prompt_tokens": event.prompt_tokens,
            "completion_tokens": event.completion_tokens,
        }
    if isinstance(event, ModelCallRequested):
        requested[event.step] = event
        params = json.loads(event.params_json or "{}")
        return {"model": params.get("model"), "attempt": event.attempt}
    if isinstance(event, ModelResponded):
        usage = event.usage
        request = requested.get(event.step)
        latency = (
            round((event.at - request.at).total_seconds() * 1000, 1)
            if request is not None
            else None
        )
        price = prices.get(event.model_id)
        cost = (
            round(price.cost(usage.prompt_tokens, usage.completion_tokens), 6)
            if price is not None
            else None
        )
        return {
            "model": event.model_id,
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "latency_ms": latency,
            "cost_usd": cost,
            "tool_calls": [c.name for c in event.tool_calls],
            "content": _short(event.content),
        }
    if isinstance(event, ToolCallRequested):
        return {
            "tool": event.tool,
            "key": event.idempotency_key,
            "args": _short(event.args_json),
            "side_effect": event.side_effect,
        }
    if isinstance(event, ToolReturned):
        return {
            "call_id": event.call_id,
            "result": _short(event.result_json),
            "error": event.error,
            "reconciled": event.reconciled,
        }
    if isinstance(event, Interrupted):
        detail = json.loads(event.detail_json or "{}")
        return {
            "reason": event.reason,
            "gate": detail.get("gate") if isinstance(detail, dict) else None,
            "wake_at": event.wake_at.isoformat() if event.wake_at else None,
            "detail": _short(event.detail_json),
        }
    if isinstance(event, Resumed):
        return {"reason": event.reason, "by": event.by}
    if isinstance(event, ApprovalRecorded):
        return {"gate": event.gate, "by": event.by, "key": event.key_id}
    if isinstance(event, DecisionRefused):
        return {
            "gate": event.gate,
            "decision": event.decision,
            "by": event.by,
            "key": event.key_id,
            "reason": event.reason,
        }
    if isinstance(event, Migrated):
        changes = json.loads(event.changes_json or "{}")
        return {
            "decision": changes.get("decision") if isinstance(changes, dict) else None,
            "from": event.from_version,
            "to": event.to_version,
        }
    if isinstance(event, StatePatched):
        if event.key.startswith(CHILD_PREFIX):  # a call's child run started
            return {"child": json.loads(event.value_json), "call_id": event.key[6:]}
        return {"key": event.key, "value": _short(event.value_json)}
    if isinstance(event, Forked):
        return {"origin": f"{event.origin_run}@{event.origin_seq}", "by": event.by}
    if isinstance(event, RunCompleted):
        return {"output": _short(event.output_json)}
    if isinstance(event, RunFailed):
        return {"kind": event.kind, "error": _short(event.error)}
    return {}


def _short(text: str | None) -> str | None:
    if text is None or len(text) <= SHORT:
        return text
    return text[: SHORT - 1] + "…"
