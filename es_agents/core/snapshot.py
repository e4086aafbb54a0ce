"""A run's state as JSON and back: what ``run_snapshots`` stores.

The reducer version (``core/reducer.py``) names the fold's rules; a snapshot
written under other rules is not used (the run is folded from its events instead).

The transcript is the one part of a run's state that grows with the run, and the
fold only ever appends to it. So the projector stores it apart, in chunks of
``CHUNK`` messages that never change once full (``run_transcripts``), and a
snapshot names only its length and chain (``transcript_len``, ``transcript_chain``):
a snapshot's size does not grow with the run, a new snapshot writes the messages
since the last one, not the whole conversation again, and a run loaded from it reads
messages only when asked for (``core/transcript.py``). Snapshots written with the
transcript inline, or without its chain, still load.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from pydantic import JsonValue

from es_agents.core.events import ToolCall
from es_agents.core.reducer import reducer_version
from es_agents.core.state import (
    LastResume,
    PendingModelCall,
    PendingToolCall,
    RunState,
    Versions,
    Waiting,
)
from es_agents.core.transcript import CHUNK, ChunkLoader, Message, Transcript


def transcript_chunks(
    transcript: Sequence[Message], since: int
) -> list[tuple[int, list[Message]]]:
    """(chunk number, messages) of every chunk holding a message at index ``since``
    or later: the chunks a snapshot writes when ``since`` messages were stored."""
    first = since // CHUNK
    last = (len(transcript) - 1) // CHUNK
    return [
        (n, list(transcript[n * CHUNK : (n + 1) * CHUNK]))
        for n in range(first, last + 1)
    ]


def chunks_needed(data: dict[str, Any]) -> int:
    """How many chunks a snapshot's transcript spans (0: inline or empty)."""
    if "transcript" in data:
        return 0
    return (int(data["transcript_len"]) + CHUNK - 1) // CHUNK


def _time(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def _parse_time(value: object) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) else None


def _fields(value: Any) -> dict[str, Any]:
    """A flat slots dataclass as a dict (``asdict`` recurses and copies: a tenth
    of the projector's time went to it)."""
    return {name: getattr(value, name) for name in value.__slots__}


def to_snapshot(state: RunState, inline: bool = True) -> dict[str, JsonValue]:
    """The state as JSON; ``inline=False``: the transcript's length in its place
    (the messages are stored as chunks)."""
    pending: dict[str, Any] | None = None
    if isinstance(state.pending, PendingModelCall):
        pending = {"kind": "model", **_fields(state.pending)}
    elif isinstance(state.pending, PendingToolCall):
        pending = {"kind": "tool", **_fields(state.pending)}
    # Tool calls in flight together beyond ``pending`` (absent when there are none,
    # so that snapshots of runs that never ran calls concurrently read as before).
    more: list[JsonValue] = [_fields(p) for p in state.pending_tools[1:]]
    waiting = None
    if state.waiting is not None:
        waiting = {
            **_fields(state.waiting),
            "approvals": list(state.waiting.approvals),
            "wake_at": _time(state.waiting.wake_at),
        }
        if not state.waiting.signed:  # as snapshots read before signed evidence
            del waiting["signed"]
    return {
        "reducer_version": reducer_version(),
        "run_id": state.run_id,
        "agent": state.agent,
        "input_json": state.input_json,
        "status": state.status,
        "seq": state.seq,
        "step": state.step,
        **(
            {"transcript": list(state.transcript)}
            if inline
            else {
                "transcript_len": len(state.transcript),
                "transcript_chain": state.transcript.chain().hex(),
            }
        ),
        "open_tool_calls": [c.model_dump() for c in state.open_tool_calls],
        "last_outcome_seq": state.last_outcome_seq,
        "pending": pending,
        **({"more_pending_tools": more} if more else {}),
        "waiting": waiting,
        "vars": state.vars,
        "prompt_tokens": state.prompt_tokens,
        "completion_tokens": state.completion_tokens,
        "model_calls": state.model_calls,
        "model_attempts": state.model_attempts,
        "tool_calls": state.tool_calls,
        "reconciled_calls": state.reconciled_calls,
        **(
            {"turns": state.turns, "message_ids": list(state.message_ids)}
            if state.turns
            else {}
        ),
        "last_resume": _fields(state.last_resume) if state.last_resume else None,
        "early_decisions": state.early_decisions,  # type: ignore[dict-item]
        "gate_decisions": state.gate_decisions,  # type: ignore[dict-item]
        "command_ids": list[JsonValue](sorted(state.command_ids)),
        "output_json": state.output_json,
        "error": state.error,
        "versions": _fields(state.versions),
        "migrations": [list(m) for m in state.migrations],
        "last_gate": state.last_gate,
        "started_at": _time(state.started_at),
        "updated_at": _time(state.updated_at),
        **(
            {"origin_run": state.origin_run, "origin_seq": state.origin_seq}
            if state.origin_run is not None
            else {}
        ),
        **(
            {
                "parent_run_id": state.parent_run_id,
                "parent_call_id": state.parent_call_id,
            }
            if state.parent_run_id is not None
            else {}
        ),
    }


def from_snapshot(
    data: dict[str, Any],
    chunks: list[list[Message]] | None = None,
    load: ChunkLoader | None = None,
) -> RunState:
    """The state a snapshot holds. When it names only the transcript's length:
    ``chunks``, its stored chunks in order, or ``load``, a way to read them when
    asked for (``chunks`` then holds those already read, from the last)."""
    pending_data = data.get("pending")
    pending: PendingModelCall | PendingToolCall | None = None
    if pending_data is not None:
        fields = {k: v for k, v in pending_data.items() if k != "kind"}
        pending = (
            PendingModelCall(**fields)
            if pending_data["kind"] == "model"
            else PendingToolCall(**fields)
        )
    waiting_data = data.get("waiting")
    waiting = None
    if waiting_data is not None:
        waiting = Waiting(
            **{**waiting_data, "wake_at": _parse_time(waiting_data.get("wake_at"))}
        )
    resume = data.get("last_resume")
    transcript = _transcript(data, chunks, load)
    return RunState(
        run_id=data["run_id"],
        agent=data["agent"],
        input_json=data["input_json"],
        status=data["status"],
        seq=data["seq"],
        step=data["step"],
        transcript=transcript,
        open_tool_calls=[ToolCall(**c) for c in data["open_tool_calls"]],
        last_outcome_seq=data["last_outcome_seq"],
        pending=pending,
        pending_tools=(
            [
                pending,
                *(PendingToolCall(**p) for p in data.get("more_pending_tools", [])),
            ]
            if isinstance(pending, PendingToolCall)
            else []
        ),
        waiting=waiting,
        vars=dict(data["vars"]),
        prompt_tokens=data["prompt_tokens"],
        completion_tokens=data["completion_tokens"],
        model_calls=data["model_calls"],
        model_attempts=data["model_attempts"],
        tool_calls=data["tool_calls"],
        reconciled_calls=data["reconciled_calls"],
        turns=data.get("turns", 0),
        message_ids=list(data.get("message_ids", [])),
        last_resume=LastResume(**resume) if resume else None,
        early_decisions=dict(data["early_decisions"]),
        gate_decisions=dict(data.get("gate_decisions", {})),
        command_ids=set(data["command_ids"]),
        output_json=data["output_json"],
        error=data["error"],
        versions=Versions(**data["versions"]),
        migrations=[(a, b) for a, b in data["migrations"]],
        last_gate=data.get("last_gate"),
        started_at=_parse_time(data.get("started_at")),
        updated_at=_parse_time(data.get("updated_at")),
        origin_run=data.get("origin_run"),
        parent_run_id=data.get("parent_run_id"),
        parent_call_id=data.get("parent_call_id"),
        origin_seq=data.get("origin_seq"),
    )


def _transcript(
    data: dict[str, Any], chunks: list[list[Message]] | None, load: ChunkLoader | None
) -> Transcript:
    if "transcript" in data:
        return Transcript(data["transcript"])
    size = int(data["transcript_len"])
    chain_hex = data.get("transcript_chain")
    chain = bytes.fromhex(chain_hex) if isinstance(chain_hex, str) else None
    if load is not None:
        last = (size - 1) // CHUNK
        given = {last - i: c for i, c in enumerate(reversed(chunks or []))}
        return Transcript.stored(size, load, chain, given)
    messages = [m for chunk in chunks or [] for m in chunk][:size]
    if len(messages) != size:
        raise ValueError(
            f"transcript of {size} messages, {len(messages)} stored in chunks"
        )
    held = Transcript(messages)
    if chain is not None:
        held.seed_chain(size, chain)
    return held
