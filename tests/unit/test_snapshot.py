"""Snapshots without their transcript: chunks that never change once full."""

from __future__ import annotations

import json

import pytest
from pydantic import JsonValue

from es_agents.core.snapshot import (
    chunks_needed,
    from_snapshot,
    to_snapshot,
    transcript_chunks,
)
from es_agents.core.state import RunState
from es_agents.core.transcript import CHUNK, Transcript


def _state(messages: int) -> RunState:
    transcript: list[dict[str, JsonValue]] = [
        {"role": "tool", "content": f"message {n}"} for n in range(messages)
    ]
    return RunState(
        run_id="r", agent="a", seq=messages, transcript=Transcript(transcript)
    )


def _store(
    stored: dict[int, list[dict[str, JsonValue]]], state: RunState, since: int
) -> None:
    for n, messages in transcript_chunks(state.transcript, since):
        stored[n] = messages


def test_a_snapshot_names_the_transcripts_length_not_its_messages() -> None:
    small = json.dumps(to_snapshot(_state(3), inline=False))
    large = json.dumps(to_snapshot(_state(3000), inline=False))
    assert len(large) - len(small) < 8  # the length's digits, nothing more
    assert "message" not in large


def test_chunks_rebuild_the_transcript_as_it_grows() -> None:
    stored: dict[int, list[dict[str, JsonValue]]] = {}
    written = 0
    for size in (5, CHUNK, CHUNK + 1, 3 * CHUNK + 7, 3 * CHUNK + 9):
        state = _state(size)
        # The projector rewrites from the last chunk it stored (it may be partial).
        _store(stored, state, (written // CHUNK) * CHUNK)
        written = size
        data = to_snapshot(state, inline=False)
        chunks = [stored[n] for n in range(chunks_needed(data))]
        assert from_snapshot(data, chunks) == state
    assert all(len(stored[n]) == CHUNK for n in range(3))  # full chunks stay full


def test_a_snapshot_with_its_transcript_inline_still_loads() -> None:
    state = _state(10)
    assert chunks_needed(to_snapshot(state)) == 0
    assert from_snapshot(to_snapshot(state)) == state


def test_missing_chunks_make_the_snapshot_unreadable() -> None:
    data = to_snapshot(_state(CHUNK + 1), inline=False)
    with pytest.raises(ValueError, match="stored in chunks"):
        from_snapshot(data, [])
