"""Recorded run logs (``tests/histories``, captured with ``es-agents replay --record``
from the demo and the runtime tests) must still fold to the states recorded with them.
A reducer change that alters any of them is a change for the version gate."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from es_agents.codec import AvroCodec
from es_agents.core import replay
from es_agents.core.snapshot import from_snapshot, to_snapshot

HISTORIES = sorted((Path(__file__).resolve().parents[1] / "histories").glob("*.json"))
CODEC = AvroCodec()


def test_there_are_recorded_histories() -> None:
    assert len(HISTORIES) >= 5


@pytest.mark.parametrize("path", HISTORIES, ids=lambda p: p.stem)
def test_recorded_history_folds_to_its_recorded_state(path: Path) -> None:
    history = json.loads(path.read_text())
    events = [CODEC.decode_event(base64.b64decode(e)) for e in history["events"]]
    assert [e.seq for e in events] == list(range(len(events)))
    state = replay(events)
    assert to_snapshot(state) == history["final"]
    assert from_snapshot(history["final"]) == state
    for cut in range(1, len(events)):  # every prefix folds, too
        replay(events[:cut])
