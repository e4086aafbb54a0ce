"""Sub-agents on the real stack: a lead run fans out to two researcher runs (each
served by its own worker process) and waits for them as a row; their ends answer
its calls; a worker killed around a child's start starts no second child; a
researcher killed between its end and telling the lead is found by the lead's
timer; cancelling the lead cancels its children; show and replay print the tree."""

from __future__ import annotations

import json
import signal
import uuid
from collections import Counter
from pathlib import Path

import pytest

from es_agents.adapters.kafka import KafkaEventLog
from es_agents.core import replay
from es_agents.core.commands import StartRun
from es_agents.core.events import ModelCallRequested
from es_agents.core.state import AWAITING_CHILDREN
from es_agents.lab.demo import cli, run_worker
from es_agents.run_tree import child_runs
from es_agents.settings import KafkaSettings
from tests.integration.gated_runs import events
from tests.integration.test_commands import until, worker

pytestmark = pytest.mark.integration

LEAD = "tests.subagent_agents:lead"
RESEARCHER = "tests.subagent_agents:researcher"


def _start(settings: KafkaSettings) -> str:
    run_id = f"run-{uuid.uuid4().hex[:10]}"
    log = KafkaEventLog(settings)
    try:
        log.send(StartRun(run_id=run_id, agent="lead", input_json='"compare"'))
    finally:
        log.close()
    return run_id


def _worker(env: dict[str, str], agent: str, crash: str | None = None) -> None:
    extra = {"ES_AGENTS_CRASH_AT": crash} if crash else {}
    done = run_worker({**env, **extra}, agent=agent, instance_id="")
    expected = -signal.SIGKILL if crash else 0
    assert done.returncode == expected, done.stderr[-3000:]


@pytest.mark.parametrize(
    "crash", [None, "after_append:tool_call_requested@1", "after_action:tool@2"]
)
def test_a_lead_fans_out_and_joins_its_children(
    crash: str | None, env: dict[str, str], kafka_settings: KafkaSettings
) -> None:
    run_id = _start(kafka_settings)
    if crash:
        _worker(env, LEAD, crash)
    _worker(env, LEAD)
    waiting = replay(events(kafka_settings, run_id))
    assert waiting.status == "paused"
    assert waiting.waiting is not None
    assert waiting.waiting.reason == AWAITING_CHILDREN
    children = sorted(waiting.children.values())
    assert len(children) == 2
    _worker(env, RESEARCHER)
    _worker(env, LEAD)
    lead_events = events(kafka_settings, run_id)
    state = replay(lead_events)
    assert state.status == "completed", state
    assert json.loads(state.output_json or "{}") == {"answer": "Summed up."}
    assert state.model_calls == 4  # its two and its children's
    assert sorted(child_runs(lead_events)) == children  # each started once
    for child in children:
        child_events = events(kafka_settings, child)
        assert [e.wire_name for e in child_events].count("run_started") == 1
        assert replay(child_events).parent_run_id == run_id
    # Every model call issued (the lead's and its children's) is recorded as
    # requested, and none more often than requested.
    requested = Counter(
        e.messages_hash
        for run in (run_id, *children)
        for e in events(kafka_settings, run)
        if isinstance(e, ModelCallRequested)
    )
    log = Path(env["ES_AGENTS_MODEL_CALLS_LOG"]).read_text().splitlines()
    issued = Counter(json.loads(line)["hash"] for line in log)
    assert all(n <= requested[digest] for digest, n in issued.items())
    shown = cli(env, "show", run_id)
    assert shown.returncode == 0, shown.stderr
    assert all(c in shown.stdout for c in children)
    assert "tree:" in shown.stdout
    replayed = cli(env, "replay", run_id)
    line = next(x for x in replayed.stdout.splitlines() if x.startswith("children:"))
    assert sorted(line.split()[1:]) == children
    audited = cli(env, "audit", "-o", "json")
    assert audited.returncode == 0, audited.stderr
    per_run = json.loads(audited.stdout)["cost"]["per_run"]
    assert sorted(per_run[run_id]["children"]) == children
    assert all(per_run[c]["parent"] == run_id for c in children)


def test_a_child_whose_worker_died_before_telling_is_found(
    env: dict[str, str], kafka_settings: KafkaSettings
) -> None:
    run_id = _start(kafka_settings)
    _worker(env, LEAD)
    # A researcher killed once a child's end is durable, before the lead is told
    # (one worker may end both children in one append: both untold then).
    _worker(env, RESEARCHER, "after_append:run_completed@1")
    _worker(env, RESEARCHER)  # the rest, told (a child that ended is not told)
    # Only the lead's timer can tell it of the child whose worker died: it looks
    # the children up in the log.
    with worker(env, LEAD):
        until(
            lambda: replay(events(kafka_settings, run_id)).status == "completed",
            60,
            "the lead finds its ended children",
        )


def test_cancelling_the_lead_cancels_its_children(
    env: dict[str, str], kafka_settings: KafkaSettings
) -> None:
    run_id = _start(kafka_settings)
    _worker(env, LEAD)
    children = list(replay(events(kafka_settings, run_id)).children.values())
    cancelled = cli(env, "cancel", run_id, "--by", "ops")
    assert cancelled.returncode == 0, cancelled.stderr
    _worker(env, LEAD)
    _worker(env, RESEARCHER)
    assert replay(events(kafka_settings, run_id)).status == "cancelled"
    for child in children:
        assert replay(events(kafka_settings, child)).status == "cancelled"
