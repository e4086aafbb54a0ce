"""Runs of a gated agent driven through worker processes, for the crash tests of
the integrations: a run to its gate, approved, to its end -- the worker killed
once at a protocol point, before the approval or after it."""

from __future__ import annotations

import json
import signal
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from es_agents.adapters.kafka import KafkaEventLog
from es_agents.core import RunState, replay
from es_agents.core.commands import StartRun
from es_agents.core.events import Event, ModelCallRequested, ToolCallRequested
from es_agents.lab.demo import cli, run_worker
from es_agents.settings import KafkaSettings

Crash = tuple[int, str]  # (0: before the approval, 1: after it; the point)


def events(settings: KafkaSettings, run_id: str) -> list[Event]:
    log = KafkaEventLog(settings)
    try:
        return log.read_run(run_id)
    finally:
        log.close()


def gated_run(
    env: dict[str, str],
    settings: KafkaSettings,
    agent: tuple[str, str],
    gate: str,
    crash: Crash | None,
    *,
    input_json: str = '"Refund order 7"',
) -> tuple[str, RunState]:
    """A run of ``agent`` (its name, its worker spec) to its end through
    ``gate``; the worker killed at ``crash`` once. Returns the run and its fold."""
    name, spec = agent
    run_id = f"run-{uuid.uuid4().hex[:10]}"
    log = KafkaEventLog(settings)
    try:
        log.send(StartRun(run_id=run_id, agent=name, input_json=input_json))
    finally:
        log.close()
    state: RunState | None = None
    for phase in (0, 1):
        if phase == 1:
            approved = cli(env, "approve", run_id, "--by", "ann")
            assert approved.returncode == 0, approved.stderr
        if crash is not None and crash[0] == phase:
            died = run_worker(
                {**env, "ES_AGENTS_CRASH_AT": crash[1]}, agent=spec, instance_id="w1"
            )
            assert died.returncode == -signal.SIGKILL, died.stderr[-3000:]
        done = run_worker(env, agent=spec, instance_id="w1")
        assert done.returncode == 0, done.stderr[-3000:]
        state = replay(events(settings, run_id))
        if phase == 0:
            assert state.status == "paused", state
            assert state.waiting is not None
            assert state.waiting.gate == gate
    assert state is not None
    return run_id, state


def effects_once(
    found: list[dict[str, Any]], settings: KafkaSettings, run_id: str, tools: list[str]
) -> None:
    """Each of ``tools``' effects happened once, in order, with the idempotency
    key its intention recorded."""
    keys = {
        e.tool: e.idempotency_key
        for e in events(settings, run_id)
        if isinstance(e, ToolCallRequested)
    }
    mine = [e for e in found if str(e["key"]).startswith(run_id + ":")]
    assert [(e["tool"], e["key"]) for e in mine] == [(t, keys[t]) for t in tools]


def model_answers_not_asked_again(
    calls_log: Path, settings: KafkaSettings, run_id: str
) -> None:
    """Every model call issued (the calls log) was recorded as requested; none
    was issued more often than requested (a recorded answer is never re-asked)."""
    requested = Counter(
        e.messages_hash
        for e in events(settings, run_id)
        if isinstance(e, ModelCallRequested)
    )
    issued = Counter(
        json.loads(line)["hash"] for line in calls_log.read_text().splitlines()
    )
    for digest, n in issued.items():
        assert n <= requested[digest], (digest, n, requested[digest])


def effect_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]
