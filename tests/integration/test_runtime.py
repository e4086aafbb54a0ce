"""The step protocol against the real stack: a worker process is SIGKILLed at each
protocol point, a fresh one resumes, and effects, model calls and the final state are
checked against a crash-free run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import psycopg
import pytest
from confluent_kafka import Consumer, Message, TopicPartition

from es_agents.adapters.kafka import KafkaEventLog
from es_agents.core import RunState, replay
from es_agents.core.commands import Approve, StartRun
from es_agents.core.events import (
    Event,
    Interrupted,
    ModelCallRequested,
    Resumed,
    ToolReturned,
)
from es_agents.lab.demo import cli, run_worker, ticket_stats
from es_agents.partitioner import partition_for
from es_agents.settings import KafkaSettings
from tests.test_support import ROOT

pytestmark = pytest.mark.integration


def _start(settings: KafkaSettings, agent: str, **input_: object) -> str:
    run_id = f"run-{uuid.uuid4().hex[:10]}"
    log = KafkaEventLog(settings)
    try:
        log.send(StartRun(run_id=run_id, agent=agent, input_json=json.dumps(input_)))
    finally:
        log.close()
    return run_id


def _events(settings: KafkaSettings, run_id: str) -> list[Event]:
    log = KafkaEventLog(settings)
    try:
        return log.read_run(run_id)
    finally:
        log.close()


def _emails(database_url: str, run_id: str) -> int:
    with psycopg.connect(database_url) as conn:
        exists = conn.execute("SELECT to_regclass('test_emails')").fetchone()
        if exists is None or exists[0] is None:
            return 0
        row = conn.execute(
            "SELECT count(*) FROM test_emails WHERE run_key LIKE %s", (run_id + ":%",)
        ).fetchone()
    return int(row[0]) if row else 0


def _normalized(state: RunState) -> list[object]:
    """The transcript without what legitimately differs between runs."""
    out: list[object] = []
    for message in state.transcript:
        content = message.get("content")
        if message.get("role") == "tool" and isinstance(content, str):
            try:
                value = json.loads(content)
            except ValueError:
                value = content
            if isinstance(value, dict):
                value = {
                    k: v
                    for k, v in value.items()
                    if k not in ("id", "created_at", "idempotency_key")
                }
            content = json.dumps(value, sort_keys=True)
        out.append(
            (
                message.get("role"),
                message.get("name"),
                content,
                json.dumps(message.get("tool_calls"), sort_keys=True),
            )
        )
    return out


def _model_calls(env: dict[str, str]) -> Counter[str]:
    path = Path(env["ES_AGENTS_MODEL_CALLS_LOG"])
    if not path.exists():
        return Counter()
    return Counter(json.loads(line)["hash"] for line in path.read_text().splitlines())


def _run_to_end(
    env: dict[str, str], kafka_settings: KafkaSettings, run_id: str, agent: str
) -> RunState:
    done = run_worker(env, agent=agent, instance_id="w1")
    assert done.returncode == 0, done.stderr[-3000:]
    return replay(_events(kafka_settings, run_id))


@pytest.fixture
def baseline(env: dict[str, str], kafka_settings: KafkaSettings) -> RunState:
    run_id = _start(kafka_settings, "crashy")
    state = _run_to_end(env, kafka_settings, run_id, "tests.agents:crashy")
    assert state.status == "completed"
    assert state.reconciled_calls == 0
    return state


CRASH_POINTS = [
    "after_append:model_call_requested@2",  # intention durable, model not called
    "after_action:model@2",  # model answered, outcome not durable
    "before_append:model_responded@3",  # outcome and next intention not durable
    "after_append:model_responded@2",  # outcome durable, next action not started
    "after_append:tool_call_requested@2",  # ticket intention durable, not called
    "after_action:tool@2",  # ticket created downstream, outcome not durable
    "before_append:tool_returned@2",  # same, at the append itself
    "after_append:tool_returned@2",  # ticket outcome durable
    "after_append:tool_call_requested@3",  # email intention durable, no ledger row
    "after_action:tool@3",  # email sent, ledger done, outcome not durable
]


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_sigkill_at_each_protocol_point_then_resume(  # noqa: PLR0917 - fixtures
    point: str,
    env: dict[str, str],
    kafka_settings: KafkaSettings,
    database_url: str,
    tickets_url: str,
    baseline: RunState,
) -> None:
    Path(env["ES_AGENTS_MODEL_CALLS_LOG"]).unlink(missing_ok=True)
    run_id = _start(kafka_settings, "crashy")
    crashed = run_worker(
        {**env, "ES_AGENTS_CRASH_AT": point},
        agent="tests.agents:crashy",
        instance_id="w1",
    )
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    mid = replay(_events(kafka_settings, run_id))
    assert mid.status == "running"

    state = _run_to_end(env, kafka_settings, run_id, "tests.agents:crashy")
    events = _events(kafka_settings, run_id)
    assert state.status == "completed", state
    assert ticket_stats(tickets_url, run_id) == {"tickets": 1, "keys": 1}
    assert _emails(database_url, run_id) == 1
    # A model call is issued at most once per recorded request; a recorded
    # completion is never asked for again.
    requested = Counter(
        e.messages_hash for e in events if isinstance(e, ModelCallRequested)
    )
    issued = _model_calls(env)
    for digest, n in issued.items():
        assert n <= requested[digest], (digest, n, requested[digest])
    assert state.model_calls == baseline.model_calls
    assert _normalized(state) == _normalized(baseline)
    assert state.output_json == baseline.output_json


def test_crash_between_ledger_claim_and_call_pauses_for_a_person(
    env: dict[str, str], kafka_settings: KafkaSettings, database_url: str
) -> None:
    run_id = _start(kafka_settings, "crashy")
    crashed = run_worker(
        {**env, "ES_AGENTS_CRASH_AT": "after_claim:tool"},
        agent="tests.agents:crashy",
        instance_id="w1",
    )
    assert crashed.returncode == -signal.SIGKILL
    state = _run_to_end(env, kafka_settings, run_id, "tests.agents:crashy")
    assert state.status == "paused"
    assert state.waiting is not None
    assert state.waiting.reason == "uncertain_effect"
    assert _emails(database_url, run_id) == 0  # never a silent second call

    settled = cli(
        env,
        "provide-input",
        run_id,
        "--by",
        "ops",
        "--input",
        '{"sent": "checked by hand"}',
    )
    assert settled.returncode == 0, settled.stderr
    state = _run_to_end(env, kafka_settings, run_id, "tests.agents:crashy")
    assert state.status == "completed"
    assert _emails(database_url, run_id) == 0
    returned = [
        e
        for e in _events(kafka_settings, run_id)
        if isinstance(e, ToolReturned) and e.reconciled
    ]
    assert [e.result_json for e in returned] == ['{"sent": "checked by hand"}']


def test_approval_commands_are_validated(
    env: dict[str, str], kafka_settings: KafkaSettings
) -> None:
    unknown = cli(env, "approve", "no-such-run", "--by", "ann")
    assert unknown.returncode == 3  # not found
    assert "unknown run no-such-run" in unknown.stderr

    run_id = _start(kafka_settings, "research")
    first = run_worker(env, agent="tests.agents:gated", instance_id="w1")
    assert first.returncode == 0, first.stderr[-2000:]
    paused = replay(_events(kafka_settings, run_id))
    assert paused.waiting is not None
    assert paused.waiting.gate == "create_ticket"

    wrong_gate = cli(env, "approve", run_id, "--by", "ann", "--gate", "deploy")
    assert wrong_gate.returncode == 1
    assert "agent 'research' has no gate 'deploy'" in wrong_gate.stderr
    first = cli(env, "approve", run_id, "--by", "ann")
    assert first.returncode == 0, first.stderr
    assert "queued" in first.stderr  # no worker serves the agent right now
    # Checked against what was applied: ann's approval is not, yet, so bob's is
    # sent too, and the worker refuses it once it applied ann's.
    twice = cli(env, "approve", run_id, "--by", "bob")
    assert twice.returncode == 0, twice.stderr

    state = _run_to_end(env, kafka_settings, run_id, "tests.agents:gated")
    assert state.status == "completed"
    resumes = [e for e in _events(kafka_settings, run_id) if isinstance(e, Resumed)]
    assert [(e.reason, e.by) for e in resumes] == [("approved", "ann")]
    shown = json.loads(cli(env, "status", run_id, "--json").stdout)
    [refused] = shown["refused_commands"]
    assert refused["reason"].startswith(f"run {run_id} is not waiting for approval")
    late = cli(env, "approve", run_id, "--by", "carl")
    assert late.returncode == 1
    assert "is completed" in late.stderr


def test_worker_refuses_a_bad_command_to_the_dlq_and_changes_nothing(
    env: dict[str, str], kafka_settings: KafkaSettings
) -> None:
    run_id = _start(kafka_settings, "research")
    _run_to_end(env, kafka_settings, run_id, "tests.agents:gated")  # paused at gate
    before = _events(kafka_settings, run_id)
    log = KafkaEventLog(kafka_settings)
    try:  # past the CLI's check, straight onto the topic
        log.send(Approve(run_id=run_id, by="mallory", gate="deploy"))
    finally:
        log.close()
    _run_to_end(env, kafka_settings, run_id, "tests.agents:gated")
    assert _events(kafka_settings, run_id) == before
    consumer = Consumer(
        {
            "bootstrap.servers": kafka_settings.bootstrap_servers,
            "group.id": "t",
            "enable.auto.commit": False,
        }
    )
    partition = partition_for(run_id, kafka_settings.partitions)
    consumer.assign([TopicPartition(kafka_settings.dlq_topic, partition, 0)])
    dead: list[Message] = []
    deadline = time.monotonic() + 20
    while not dead and time.monotonic() < deadline:
        dead = [m for m in consumer.consume(10, timeout=0.5) if m.error() is None]
    consumer.close()
    assert dead, "the refused command is not in the DLQ"
    reason = dict(dead[0].headers() or [])["es.dlq.reason"]
    assert isinstance(reason, bytes)
    assert b"refused: agent 'research' has no gate 'deploy'" in reason


def test_an_approval_sent_before_the_gate_is_kept_and_applied(
    env: dict[str, str], kafka_settings: KafkaSettings
) -> None:
    started = cli(env, "start", "research", "--queue", "--input", '{"topic": "early"}')
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    early = cli(env, "approve", run_id, "--by", "ann", "--gate", "create_ticket")
    assert early.returncode == 0, early.stderr
    again = cli(env, "approve", run_id, "--by", "bob", "--gate", "create_ticket")
    assert again.returncode == 0, again.stderr  # ann's is not applied yet

    state = _run_to_end(env, kafka_settings, run_id, "tests.agents:gated")
    assert state.status == "completed"  # one worker, no pause between processes
    events = _events(kafka_settings, run_id)
    gate = [e for e in events if isinstance(e, Interrupted | Resumed)]
    assert [(type(e).__name__, getattr(e, "by", None)) for e in gate] == [
        ("Interrupted", None),
        ("Resumed", "ann"),
    ]
    shown = json.loads(cli(env, "status", run_id, "--json").stdout)
    assert [c["reason"] for c in shown["refused_commands"]] == [
        f"gate 'create_ticket' of run {run_id} was already approved by ann"
    ]


def test_a_timer_survives_worker_restarts_and_fires_by_the_database_clock(
    env: dict[str, str], kafka_settings: KafkaSettings, database_url: str
) -> None:
    run_id = _start(kafka_settings, "sleepy", sleep_seconds=4)
    first = run_worker(env, agent="tests.agents:sleepy", instance_id="w1")
    assert first.returncode == 0, first.stderr[-2000:]
    state = replay(_events(kafka_settings, run_id))
    assert state.waiting is not None
    assert state.waiting.reason == "sleeping"
    wake_at = state.waiting.wake_at
    assert wake_at is not None

    def worker() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "es_agents.cli",
                "worker",
                "--agent",
                "tests.agents:sleepy",
                "--instance-id",
                "w1",
            ],
            cwd=ROOT,
            env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    doomed = worker()
    time.sleep(1.0)  # let it join and idle; the timer is not due for seconds
    doomed.send_signal(signal.SIGKILL)
    doomed.wait(10)
    assert replay(_events(kafka_settings, run_id)).status == "paused"
    survivor = worker()
    try:
        deadline = time.monotonic() + 60
        while replay(_events(kafka_settings, run_id)).status != "completed":
            assert time.monotonic() < deadline, "the timer never fired"
            time.sleep(0.3)
    finally:
        survivor.send_signal(signal.SIGTERM)
        survivor.wait(30)
    events = _events(kafka_settings, run_id)
    resumed = next(e for e in events if isinstance(e, Resumed))
    assert resumed.reason == "timer"
    assert resumed.at >= wake_at
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT due_at, fired_at FROM timers WHERE run_id = %s", (run_id,)
        ).fetchone()
    assert row is not None
    due_at, fired_at = row
    assert due_at == wake_at
    assert fired_at is not None
    assert fired_at >= due_at


def test_a_sleep_scheduled_again_is_armed_again(database_url: str) -> None:
    """A sleep whose `interrupted` was not committed is planned again with the same
    timer id; if its timer already fired (at a run that was not asleep yet, so it
    woke nothing), scheduling it again must arm it again."""
    from datetime import UTC, datetime, timedelta  # noqa: PLC0415

    from es_agents.adapters.postgres import Database, PostgresTimers  # noqa: PLC0415

    db = Database(database_url)
    db.migrate()
    timers = PostgresTimers(db)
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    timer = f"{run_id}:7"
    due = datetime.now(UTC) - timedelta(seconds=1)
    fired: list[str] = []

    def fire(due: Sequence[tuple[str, str, datetime]]) -> None:
        fired.extend(timer_id for timer_id, _, _ in due if timer_id == timer)

    try:
        timers.schedule(timer, run_id, due)
        timers.fire_due(fire)
        timers.fire_due(fire)  # fired once, then marked
        assert fired == [timer]
        timers.schedule(timer, run_id, due)
        timers.fire_due(fire)
        assert fired == [timer, timer]
    finally:
        db.close()


def test_a_slow_wake_up_holds_no_transaction_open(database_url: str) -> None:
    """Sending a timer's wake-up can wait out a broker's failover (seconds): the
    timers are claimed for a while, not held locked in an open transaction, which
    the server ends after the session's idle limit (it ended the worker). A claimed
    timer is not fired by another worker meanwhile; a send that fails gives the
    claim up at once."""
    from datetime import UTC, datetime, timedelta  # noqa: PLC0415

    from es_agents.adapters.postgres import Database, PostgresTimers  # noqa: PLC0415
    from es_agents.errors import AppendError  # noqa: PLC0415

    db = Database(database_url, idle_in_transaction=0.5)
    db.migrate()
    timers = PostgresTimers(db)
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    timer = f"{run_id}:3"
    mine: list[list[str]] = []
    others: list[str] = []

    def other(due: Sequence[tuple[str, str, datetime]]) -> None:
        others.extend(t for t, _, _ in due if t == timer)

    def slow(due: Sequence[tuple[str, str, datetime]]) -> None:
        mine.append([t for t, _, _ in due if t == timer])
        timers.fire_due(other)  # another worker, meanwhile
        time.sleep(1.0)  # the send waits (the scenario: twice the idle limit)

    def failing(due: Sequence[tuple[str, str, datetime]]) -> None:
        raise AppendError("the broker did not acknowledge")

    try:
        timers.schedule(timer, run_id, datetime.now(UTC) - timedelta(seconds=1))
        with pytest.raises(AppendError):
            timers.fire_due(failing)
        timers.fire_due(slow)  # the claim given up: due again at once
        assert mine == [[timer]]
        assert others == []
        found = timers.get(timer)
        assert found is not None
        assert found[1] is not None  # marked fired, after the slow send
    finally:
        db.close()
