"""Recorded run logs (``tests/histories``, captured with ``es-agents replay --record``
from the demo and the runtime tests) must still fold to the states recorded with them.

Each history keeps the reducer version it was recorded under (its final state's
``reducer_version``). The version is derived from the fold's code
(``core/reducer.py``); a history that folds otherwise fails with what it means:
under the same version, the fold changed where the version does not look; under
another, the runs in flight started under the old one fold otherwise too. When the
new fold is the intended one, ``ES_AGENTS_RERECORD=1`` writes the new states (and
version) into the histories."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import pytest

from es_agents.codec import AvroCodec
from es_agents.core import replay
from es_agents.core.reducer import reducer_modules, reducer_version, rules_text
from es_agents.core.snapshot import from_snapshot, to_snapshot

HISTORIES = sorted((Path(__file__).resolve().parents[1] / "histories").glob("*.json"))
CODEC = AvroCodec()


def test_there_are_recorded_histories() -> None:
    assert len(HISTORIES) >= 5


def _differing(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    keys = (set(old) | set(new)) - {"reducer_version"}
    return sorted(k for k in keys if old.get(k) != new.get(k))


@pytest.mark.parametrize("path", HISTORIES, ids=lambda p: p.stem)
def test_recorded_history_folds_to_its_recorded_state(path: Path) -> None:
    history = json.loads(path.read_text())
    events = [CODEC.decode_event(base64.b64decode(e)) for e in history["events"]]
    assert [e.seq for e in events] == list(range(len(events)))
    state = replay(events)
    for cut in range(1, len(events)):  # every prefix folds, too
        replay(events[:cut])
    now, recorded = to_snapshot(state), history["final"]
    was, version = recorded["reducer_version"], reducer_version()
    differing = _differing(recorded, now)
    if os.environ.get("ES_AGENTS_RERECORD") and (differing or was != version):
        path.write_text(json.dumps({**history, "final": now}, indent=1) + "\n")
        return
    if differing and was == version:
        pytest.fail(
            f"{path.name} folds otherwise ({', '.join(differing)}) under the same "
            f"reducer version {version}: the fold's behaviour changed in code the "
            f"version is not derived from (it reads {', '.join(reducer_modules())} "
            "in es_agents/core). Move that logic into those modules, or have fold.py "
            "import its module, so that the version changes with it."
        )
    if differing:
        pytest.fail(
            f"The reducer changed (recorded under version {was}, now {version}) and "
            f"{path.name} folds otherwise ({', '.join(differing)}): runs in flight "
            f"that started under {was} would fold otherwise too, and the version "
            "gate refuses them unless the deploy allows it (es-agents upgrade check "
            "lists them). If the new fold is the intended one: ES_AGENTS_RERECORD=1 "
            "pytest tests/unit/test_histories.py."
        )
    assert from_snapshot(now) == state


def test_the_version_follows_the_code_not_its_comments() -> None:
    fold = "def f(x):\n    return x + 1\n"
    noted = (
        '"""A module."""\n# a comment\ndef f(x):\n    """Adds one."""\n'
        "    return (x +\n            1)  # one more\n"
    )
    changed = "def f(x):\n    return x + 2\n"
    assert rules_text(noted) == rules_text("def f(x):\n    return (x + 1)\n")
    assert rules_text(fold) != rules_text(changed)
    assert rules_text("x = '# not a comment'\n") == "x = '# not a comment'"
    assert reducer_modules() == ("fold", "state", "transcript")
    assert 1 <= reducer_version() < 2**31
