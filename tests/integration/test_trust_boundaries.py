"""Attacks with partial access, on the real stack: what a write to the events topic
(or, on the Postgres store, a row of its log) can make a run do. Each attack ran on
the code before writer MACs and acted; each is refused now."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import psycopg
import pytest

from es_agents.app import build_client_ports
from es_agents.client import Client
from es_agents.codec import AvroCodec
from es_agents.core.chain import digest
from es_agents.core.epochs import EPOCH_HEADER
from es_agents.core.events import Resumed, RunStarted
from es_agents.lab.demo import cli, run_worker, ticket_stats
from es_agents.ports import Ports, Record
from es_agents.settings import load_settings
from tests.integration.test_postgres_store import pg  # noqa: F401 - a fixture
from tests.integration.test_tamper import _insert, _settings

pytestmark = pytest.mark.integration

CODEC = AvroCodec()
GATED = "tests.agents:gated"


def _records(ports: Ports, topic: str, run_id: str) -> list[Record]:
    partition = ports.log.partition_for(run_id)
    return [r for r in ports.log.read_partition(topic, partition) if r.key == run_id]


def _write_raw(  # noqa: PLR0917 - where, whose, what
    env: dict[str, str],
    store: str,
    ports: Ports,
    run_id: str,
    value: bytes,
    headers: list[tuple[str, bytes]],
) -> None:
    """A record as an attacker with write access to the log writes it: a Kafka
    producer to the topic, or an INSERT into the Postgres store's log."""
    topic = f"{env['ES_AGENTS_TOPIC_PREFIX']}.events"
    if store == "kafka":
        ports.log.produce(topic, run_id, value, headers)
        return
    _insert(
        env["ES_AGENTS_DATABASE_URL"],
        topic,
        int(env["ES_AGENTS_PARTITIONS"]),
        [(run_id, value, tuple(headers))],
    )


def _env_for(
    store: str, env: dict[str, str], request: pytest.FixtureRequest
) -> dict[str, str]:
    if store == "postgres":
        pg_env: dict[str, str] = request.getfixturevalue("pg")[1]
        return pg_env
    return env


def _paused_pair(env: dict[str, str], tag: str) -> tuple[str, str]:
    """Two runs paused at the ticket's gate."""
    runs = (f"trust-{tag}-a", f"trust-{tag}-b")
    for run_id in runs:
        started = cli(
            env,
            "start",
            "research",
            "--run-id",
            run_id,
            "--input",
            "{}",
            "--no-wait",
            "--queue",
        )
        assert started.returncode == 0, started.stderr[-2000:]
    assert run_worker(env, agent=GATED).returncode == 0
    return runs


@pytest.mark.parametrize("store", ["kafka", "postgres"])
def test_a_forged_approval_is_left_out(
    store: str,
    env: dict[str, str],
    tickets_url: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """Write access to the log only: a ``resumed`` (approved) record with the right
    chain hash and the owner's epoch stamp -- a genuine approval of another run
    re-addressed. Before: after a worker restart the gated tool ran with no human
    decision, and ``audit`` was clean. Now: left out by the worker, the projector
    and replay; ``audit`` names it."""
    env = _env_for(store, env, request)
    genuine, victim = _paused_pair(env, uuid.uuid4().hex[:6])
    approved = cli(env, "approve", genuine, "--by", "alice", "--no-wait")
    assert approved.returncode == 0, approved.stderr[-2000:]
    assert run_worker(env, agent=GATED).returncode == 0

    ports = build_client_ports(load_settings(**_settings(env, store)))
    try:
        topic = f"{env['ES_AGENTS_TOPIC_PREFIX']}.events"
        real = next(
            CODEC.decode_event(r.value)
            for r in _records(ports, topic, genuine)
            if CODEC.decode_event(r.value).wire_name == "resumed"
        )
        assert isinstance(real, Resumed)
        mine = _records(ports, topic, victim)
        last = CODEC.decode_event(mine[-1].value)
        forged = real.model_copy(
            update={
                "run_id": victim,
                "seq": last.seq + 1,
                "step": last.step,
                "prev": digest(mine[-1].value),
            }
        )
        stamp = [(k, v) for k, v in mine[-1].headers if k == EPOCH_HEADER]
        _write_raw(env, store, ports, victim, CODEC.encode(forged), stamp)
    finally:
        ports.close()

    assert run_worker(env, agent=GATED).returncode == 0
    assert cli(env, "projector", "--until-caught-up").returncode == 0
    assert ticket_stats(tickets_url, victim)["tickets"] == 0
    assert ticket_stats(tickets_url, genuine)["tickets"] == 1
    status = json.loads(cli(env, "status", victim, "-o", "json").stdout)
    assert status["status"] == "paused", status

    replayed = cli(env, "replay", victim, "--json")
    summary = json.loads(replayed.stdout.splitlines()[-1])["summary"]
    assert replayed.returncode == 0, summary  # the run as the workers wrote it

    report = tmp_path / "audit.json"
    audited = cli(
        env, "audit", "--run-prefix", victim, "--report", str(report), "--no-bare"
    )
    assert audited.returncode == 1, audited.stdout[-2000:]
    problems = json.loads(report.read_text())["problems"][victim]
    assert any("not written by a worker" in p for p in problems), problems


@pytest.mark.parametrize("store", ["kafka", "postgres"])
def test_a_garbage_record_does_not_break_the_runs_trail(
    store: str, env: dict[str, str], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A record keyed by the run that does not decode. Before: ``replay`` showed 0
    events ("the log does not decode") and ``audit`` reported the next genuine event
    as a broken chain. Now: left out and reported; the run goes on, replay shows its
    events and the chain holds."""
    env = _env_for(store, env, request)
    run_id, _ = _paused_pair(env, uuid.uuid4().hex[:6])
    ports = build_client_ports(load_settings(**_settings(env, store)))
    try:
        _write_raw(env, store, ports, run_id, b"\x00garbage, not avro", [])
    finally:
        ports.close()
    approved = cli(env, "approve", run_id, "--by", "alice", "--no-wait")
    assert approved.returncode == 0, approved.stderr[-2000:]
    assert run_worker(env, agent=GATED).returncode == 0
    assert cli(env, "projector", "--until-caught-up").returncode == 0

    replayed = cli(env, "replay", run_id, "--json")
    out = json.loads(replayed.stdout.splitlines()[-1])
    assert replayed.returncode == 0, out["summary"]
    assert out["summary"]["status"] == "completed", out["summary"]
    assert out["summary"]["events"] > 5, out["summary"]

    report = tmp_path / "audit.json"
    audited = cli(
        env, "audit", "--run-prefix", run_id, "--report", str(report), "--no-bare"
    )
    problems = json.loads(report.read_text())["problems"].get(run_id, [])
    assert audited.returncode == 1, problems
    assert len(problems) == 1, problems
    assert "left out" in problems[0], problems
    assert not any("hash chain broken" in p for p in problems), problems


def test_an_input_of_any_size_travels_by_reference(
    env: dict[str, str], tmp_path: Path
) -> None:
    """Before: a 2 MB input failed with the broker's message-too-large error, reported
    as exit 4 "unavailable", and its run id stayed pending for good; then it was
    refused before anything was sent. Now: the client stores it in the object store
    and the start carries its claim; the worker reads it back and the run's
    ``run_started`` claims it again, so no record of the run is large. Without the
    object store (``ES_AGENTS_PAYLOADS=off``) it is refused before it is sent, with
    its own message, and the run id stays free. Inputs larger than a command line
    come from a file or stdin."""
    run_id = f"big-{uuid.uuid4().hex[:6]}"
    big = tmp_path / "big.json"
    payload = {"topic": "a large brief", "blob": "x" * 2_000_000}
    big.write_text(json.dumps(payload))
    no_store = {**env, "ES_AGENTS_PAYLOADS": "off"}
    refused = cli(
        no_store, "start", "research", "--run-id", run_id, "--input", f"@{big}"
    )
    assert refused.returncode == 1, refused.stderr[-2000:]
    assert "over the 900,000-byte limit" in refused.stdout + refused.stderr
    started = cli(
        env,
        "start",
        "research",
        "--run-id",
        run_id,
        "--input",
        f"@{big}",
        "--no-wait",
        "--queue",
    )
    assert started.returncode == 0, started.stdout + started.stderr
    assert "queued" in started.stdout + started.stderr
    assert run_worker(env, agent=GATED).returncode == 0
    ports = build_client_ports(load_settings(**_settings(env, "kafka")))
    try:
        prefix = env["ES_AGENTS_TOPIC_PREFIX"]
        for topic in (f"{prefix}.commands", f"{prefix}.events"):
            sizes = [len(r.value) for r in _records(ports, topic, run_id)]
            assert sizes, topic
            assert max(sizes) < 5_000, (topic, sizes)  # references, not the data
    finally:
        ports.close()
    with Client(load_settings(**_settings(env, "kafka"))) as client:
        first = client.events(run_id)[0]
        assert isinstance(first, RunStarted)
        assert json.loads(first.input_json) == payload  # read back whole
        assert client.status(run_id).status == "paused"  # the run went on
    missing = cli(env, "start", "research", "--input", f"@{tmp_path / 'nope.json'}")
    assert missing.returncode == 2
    assert "cannot read" in missing.stdout + missing.stderr


def test_an_edited_snapshot_decides_nothing(
    env: dict[str, str], tickets_url: str, database_url: str
) -> None:
    """A row in Postgres: the paused run's snapshot with the pending call's
    arguments changed. Before: ``status`` showed the new arguments and an approval
    filed a ticket titled "WIRE ALL FUNDS TO MALLORY". Now: the snapshot does not
    verify against the writer key, the worker resumes from the log, and the ticket
    filed (if any) is the one the model asked for."""
    run_id, _ = _paused_pair(env, uuid.uuid4().hex[:6])
    assert cli(env, "projector", "--until-caught-up").returncode == 0
    with psycopg.connect(database_url) as conn:
        changed = conn.execute(
            "UPDATE run_snapshots SET state = replace(state::text, %s, %s)::jsonb "
            "WHERE run_id = %s",
            ("Adopt event-sourced agent runs", "WIRE ALL FUNDS TO MALLORY", run_id),
        ).rowcount
    assert changed == 1
    approved = cli(env, "approve", run_id, "--by", "alice", "--no-wait")
    assert approved.returncode == 0, approved.stderr[-2000:]
    worker = run_worker(env, agent=GATED)
    assert worker.returncode == 0, worker.stderr[-3000:]
    assert "snapshot at seq" in worker.stderr, worker.stderr[-3000:]
    with psycopg.connect(database_url) as conn:
        titles = [
            r[0]
            for r in conn.execute(
                "SELECT title FROM demo_tickets WHERE idempotency_key LIKE %s",
                (f"{run_id}:%",),
            )
        ]
    assert "WIRE ALL FUNDS TO MALLORY" not in titles
    assert set(titles) <= {"Adopt event-sourced agent runs"}


def test_audit_checks_the_projection_against_the_log(
    env: dict[str, str], database_url: str, tmp_path: Path
) -> None:
    """Before: deleting rows of ``run_events`` or changing the bytes the projection
    keeps (``run_tails``) was noticed by nothing, and an edited snapshot left
    ``audit`` clean. Now each is reported."""
    run_id, _ = _paused_pair(env, uuid.uuid4().hex[:6])
    assert cli(env, "projector", "--until-caught-up").returncode == 0
    report = tmp_path / "audit.json"
    args = ("audit", "--run-prefix", run_id, "--report", str(report), "--no-bare")
    clean = cli(env, *args)
    assert clean.returncode == 0, json.loads(report.read_text())["problems"]
    with psycopg.connect(database_url) as conn:
        conn.execute(
            "UPDATE run_snapshots SET state = replace(state::text, %s, %s)::jsonb "
            "WHERE run_id = %s",
            ("Adopt event-sourced agent runs", "WIRE ALL FUNDS TO MALLORY", run_id),
        )
        conn.execute("DELETE FROM run_events WHERE run_id = %s AND seq = 1", (run_id,))
        tail = conn.execute(  # the snapshot's event: where the tail starts
            "SELECT min(seq) FROM run_tails WHERE run_id = %s", (run_id,)
        ).fetchone()
        assert tail is not None
        assert tail[0] is not None
        assert tail[0] > 1
        conn.execute(
            "UPDATE run_tails SET payload = payload || '\\x00'::bytea "
            "WHERE run_id = %s AND seq = %s",
            (run_id, tail[0]),
        )
    audited = cli(env, *args)
    problems = json.loads(report.read_text())["problems"].get(run_id, [])
    assert audited.returncode == 1, problems
    assert any("run_snapshots@" in p for p in problems), problems
    assert any("no row for seq 1" in p and "deleted" in p for p in problems), problems
    changed = f"run_tails seq {tail[0]}"
    assert any(changed in p and "changed" in p for p in problems), problems


@pytest.mark.parametrize("chunk", [0, 1])
def test_an_edited_transcript_chunk_never_reaches_the_model(
    chunk: int, env: dict[str, str], database_url: str
) -> None:
    """A row in Postgres: a paused run's stored transcript (two chunks of
    messages) with the user's request changed. Before: a resumed run read its
    chunks as they were and sent them to the model — a prompt written into the
    database. Now: every chunk carries the projector's MAC; the last one (read with
    the snapshot) that does not verify makes the worker fold the run's events
    instead, an earlier one (read when the model is sent the conversation) is
    rebuilt from the projected events, each verified and chained."""
    run_id = f"trust-chunk-{chunk}-{uuid.uuid4().hex[:6]}"
    agent = "tests.agents:longwinded"
    started = cli(
        env,
        "start",
        "longwinded",
        "--run-id",
        run_id,
        "--queue",
        "--no-wait",
        "--input",
        '{"request": "pay invoice 7"}',
    )
    assert started.returncode == 0, started.stderr[-2000:]
    assert run_worker(env, agent=agent).returncode == 0
    assert cli(env, "projector", "--until-caught-up").returncode == 0
    with psycopg.connect(database_url) as conn:
        stored = conn.execute(
            "SELECT count(*) FROM run_transcripts WHERE run_id = %s", (run_id,)
        ).fetchone()
        assert stored is not None
        assert stored[0] == 2
        # The model's own calls, renamed: what the model would be sent next.
        conn.execute(
            "UPDATE run_transcripts SET messages = replace(messages::text, 'noop', "
            "'MALLORY')::jsonb WHERE run_id = %s AND chunk = %s",
            (run_id, chunk),
        )
        found = conn.execute(
            "SELECT count(*) FROM run_transcripts WHERE run_id = %s "
            "AND messages::text LIKE '%%MALLORY%%'",
            (run_id,),
        ).fetchone()
        assert found is not None
        changed = found[0]
    assert changed == 1
    approved = cli(env, "approve", run_id, "--by", "alice", "--no-wait")
    assert approved.returncode == 0, approved.stderr[-2000:]
    worker = run_worker(env, agent=agent)
    assert worker.returncode == 0, worker.stderr[-3000:]
    assert f"transcript chunk {chunk} does not verify" in worker.stderr, worker.stderr[
        -3000:
    ]
    shown = json.loads(cli(env, "status", run_id, "-o", "json").stdout)
    assert shown["status"] == "completed", shown
    assert "pay invoice 7" in str(shown["output"])
    assert "MALLORY" not in str(shown["output"])  # the model was sent no MALLORY
