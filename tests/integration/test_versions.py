"""The version gate on the real stack: runs paused under v1 code, resumed under v2."""

from __future__ import annotations

import json

import pytest

from es_agents.core import RunState, replay
from es_agents.core.events import Migrated, Resumed, StatePatched
from es_agents.lab.demo import cli, run_worker, ticket_stats
from es_agents.settings import KafkaSettings
from tests.integration.test_runtime import _events, _start

pytestmark = pytest.mark.integration


def _paused_at_gate(env: dict[str, str], kafka: KafkaSettings) -> str:
    run_id = _start(kafka, "research")
    first = run_worker(env, agent="tests.agents:gated", instance_id="w1")
    assert first.returncode == 0, first.stderr[-2000:]
    approved = cli(env, "approve", run_id, "--by", "ann")
    assert approved.returncode == 0, approved.stderr
    return run_id


def _state(kafka: KafkaSettings, run_id: str) -> RunState:
    return replay(_events(kafka, run_id))


def test_v2_without_a_migration_blocks_then_a_migration_continues_the_run(
    env: dict[str, str], kafka_settings: KafkaSettings, tickets_url: str
) -> None:
    run_id = _paused_at_gate(env, kafka_settings)
    v2 = run_worker(env, agent="tests.agents:gated_v2", instance_id="w1")
    assert v2.returncode == 0, v2.stderr[-2000:]
    state = _state(kafka_settings, run_id)
    assert state.status == "blocked"
    assert state.waiting is not None
    assert state.waiting.reason == "version_mismatch"
    assert state.last_gate is not None
    assert "research@1" in str(state.last_gate["reason"])
    assert "research@2" in str(state.last_gate["reason"])
    assert ticket_stats(tickets_url, run_id)["tickets"] == 0  # nothing ran under v2
    blocked_events = len(_events(kafka_settings, run_id))

    again = run_worker(env, agent="tests.agents:gated_v2", instance_id="w1")
    assert again.returncode == 0
    assert len(_events(kafka_settings, run_id)) == blocked_events  # no retry loop

    shown = cli(env, "status", run_id, "--json")
    summary = json.loads(shown.stdout)
    assert summary["status"] == "blocked"
    assert summary["versions"]["agent_version"] == "research@1"
    assert summary["last_gate"]["decision"] == "refuse"

    fixed = run_worker(env, agent="tests.agents:gated_v2_migrating", instance_id="w1")
    assert fixed.returncode == 0, fixed.stderr[-2000:]
    events = _events(kafka_settings, run_id)
    state = replay(events)
    assert state.status == "completed"
    assert state.versions.agent_version == "research@2"
    assert str(state.vars["review_note"]).startswith("migrated at seq")
    migrated = [e for e in events if isinstance(e, Migrated)]
    assert [(m.from_version, m.to_version) for m in migrated] == [
        ("research@1", "research@2")
    ]
    changes = json.loads(migrated[0].changes_json)
    assert changes["decision"] == "migrate"
    assert changes["changed"]["agent_version"] == ["research@1", "research@2"]
    assert any(isinstance(e, Resumed) and e.reason == "version_ok" for e in events)
    assert any(isinstance(e, StatePatched) and e.key == "review_note" for e in events)
    assert ticket_stats(tickets_url, run_id)["tickets"] == 1


def test_a_changed_prompt_is_allowed_and_recorded(
    env: dict[str, str], kafka_settings: KafkaSettings
) -> None:
    run_id = _paused_at_gate(env, kafka_settings)
    done = run_worker(env, agent="tests.agents:gated_new_prompt", instance_id="w1")
    assert done.returncode == 0, done.stderr[-2000:]
    events = _events(kafka_settings, run_id)
    assert replay(events).status == "completed"
    (migrated,) = [e for e in events if isinstance(e, Migrated)]
    changes = json.loads(migrated.changes_json)
    assert changes["decision"] == "verbatim"
    assert set(changes["changed"]) == {"prompt_hash"}


def test_a_changed_tool_schema_is_refused(
    env: dict[str, str], kafka_settings: KafkaSettings
) -> None:
    run_id = _paused_at_gate(env, kafka_settings)
    done = run_worker(env, agent="tests.agents:gated_new_tools", instance_id="w1")
    assert done.returncode == 0, done.stderr[-2000:]
    state = _state(kafka_settings, run_id)
    assert state.status == "blocked"
    assert state.last_gate is not None
    assert "tools_hash" in str(state.last_gate["reason"])
    # The old code can still continue it: nothing was lost.
    old = run_worker(env, agent="tests.agents:gated", instance_id="w1")
    assert old.returncode == 0, old.stderr[-2000:]
    assert _state(kafka_settings, run_id).status == "completed"
