"""The projector against the real broker and database: projection = fold, exactly
once across kills, rebuildable from the log, and O(K) resume."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer
from pydantic import SecretStr

from es_agents.adapters.kafka import KafkaEventLog
from es_agents.adapters.postgres import Database
from es_agents.adapters.postgres_projections import PostgresProjections
from es_agents.app import build_projector
from es_agents.codec import AvroCodec
from es_agents.core import replay
from es_agents.core.events import Event, StatePatched
from es_agents.core.state import RunState
from es_agents.core.step import CallModel, request_hash
from es_agents.core.transcript import CHUNK, Conversation, Message
from es_agents.dev import DevStack
from es_agents.errors import ConfigError
from es_agents.lab.demo import script
from es_agents.runtime.loader import RunLoader
from es_agents.settings import KafkaSettings, Settings
from projectors.runs import load_state
from tests.stalls import server_sessions, stalled_session
from tests.test_support import ROOT, script_of

pytestmark = pytest.mark.integration


@pytest.fixture
def fresh_db(dev_stack: DevStack) -> Iterator[str]:
    name = f"es_proj_{uuid.uuid4().hex[:10]}"
    dev_stack.postgres.create_database(name)
    yield dev_stack.dev.database_url.rsplit("/", 1)[0] + f"/{name}"
    dev_stack.postgres.drop_database(name)


def _settings(kafka: KafkaSettings, db: str, k: int) -> Settings:
    return Settings(kafka=kafka, database_url=SecretStr(db), snapshot_every=k)


def _write_interleaved(
    kafka: KafkaSettings, runs: int, seed: int
) -> dict[str, list[Event]]:
    rng = random.Random(seed)
    logs = {f"run-{seed}-{n}": script_of(f"run-{seed}-{n}", rng) for n in range(runs)}
    log = KafkaEventLog(kafka)
    cursors = dict.fromkeys(logs, 0)
    lock = threading.Lock()

    def writer(mine: list[str]) -> None:
        local = random.Random(rng.random())
        while True:
            with lock:
                live = [r for r in mine if cursors[r] < len(logs[r])]
            if not live:
                return
            run_id = local.choice(live)
            n = local.randint(1, 4)
            batch = logs[run_id][cursors[run_id] : cursors[run_id] + n]
            log.append(batch)
            with lock:
                cursors[run_id] += len(batch)

    ids = list(logs)
    threads = [threading.Thread(target=writer, args=(ids[i::3],)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log.close()
    return logs


def _project(settings: Settings, within: float = 150) -> int:
    """A projector until it caught up; the events it projected. One that has not
    within ``within`` seconds is stopped and the test fails, saying where it was
    (never a test that waits for ever)."""
    built: list[Any] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            built.append(build_projector(settings, batch_size=97))
            built[0].run(until_caught_up=True, idle_seconds=0.3)
        except BaseException as e:
            failed.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(within)
    if thread.is_alive():
        if not built:
            pytest.fail(f"the projector was not even built within {within} s")
        projector = built[0]
        source: Any = projector.source
        consumer = getattr(source, "_consumer", None)
        where = {
            "projected": projector.projected,
            "assigned": [tp.partition for tp in consumer.assignment()]
            if consumer is not None
            else None,
            "at_end": sorted(getattr(source, "_at_end", ())),
            "sessions": server_sessions(settings.database_url.get_secret_value()),
        }
        projector.stop()
        thread.join(30)
        pytest.fail(f"the projector did not catch up within {within} s: {where}")
    if failed:
        raise failed[0]
    return int(built[0].projected)


def _tables(db: str) -> dict[str, list[tuple[Any, ...]]]:
    with psycopg.connect(db) as conn:
        return {
            "runs": conn.execute("SELECT * FROM runs ORDER BY run_id").fetchall(),
            "run_events": conn.execute(
                'SELECT run_id, seq, step, type, at, partition, "offset" '
                "FROM run_events ORDER BY run_id, seq"
            ).fetchall(),
            "run_tails": conn.execute(
                "SELECT run_id, seq, payload, mac FROM run_tails ORDER BY run_id, seq"
            ).fetchall(),
            "run_snapshots": conn.execute(
                'SELECT run_id, seq, reducer_version, partition, "offset", state '
                "FROM run_snapshots ORDER BY run_id, seq"
            ).fetchall(),
            "run_transcripts": conn.execute(
                "SELECT run_id, chunk, messages FROM run_transcripts "
                "ORDER BY run_id, chunk"
            ).fetchall(),
        }


def test_projection_equals_the_fold_of_random_interleavings(
    kafka_settings: KafkaSettings, fresh_db: str
) -> None:
    k = 7
    logs = _write_interleaved(kafka_settings, runs=12, seed=11)
    settings = _settings(kafka_settings, fresh_db, k)
    assert _project(settings) == sum(len(v) for v in logs.values())
    codec = AvroCodec()
    with psycopg.connect(fresh_db) as conn:
        for run_id, events in logs.items():
            full = replay(events)
            status, step, last_seq = conn.execute(
                "SELECT status, step, last_seq FROM runs WHERE run_id = %s", (run_id,)
            ).fetchone() or (None, None, None)
            assert (status, step, last_seq) == (full.status, full.step, full.seq)
            assert (
                load_state(conn, codec.decode_event, run_id) == full
            )  # snapshot + tail
            seqs = [
                r[0]
                for r in conn.execute(
                    "SELECT seq FROM run_snapshots WHERE run_id = %s ORDER BY seq",
                    (run_id,),
                )
            ]
            expected = {
                e.seq
                for e in events
                if (e.seq + 1) % k == 0
                or e.wire_name in ("interrupted", "run_completed", "run_failed")
            }
            assert seqs == [max(expected)]  # only the latest snapshot is kept


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_projector_killed_anywhere_converges_to_a_rebuild_from_scratch(
    seed: int,
    kafka_settings: KafkaSettings,
    fresh_db: str,
    database_url: str,
    dev_stack: DevStack,
) -> None:
    logs = _write_interleaved(kafka_settings, runs=8, seed=seed)
    total = sum(len(v) for v in logs.values())
    rng = random.Random(seed)
    env = {
        "ES_AGENTS_BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
        "ES_AGENTS_TOPIC_PREFIX": kafka_settings.topic_prefix,
        "ES_AGENTS_PARTITIONS": str(kafka_settings.partitions),
        "ES_AGENTS_DATABASE_URL": fresh_db,
        "ES_AGENTS_SNAPSHOT_EVERY": "5",
        "PYTHONPATH": str(ROOT),
    }
    kills = 0
    for _ in range(3):  # kill it mid-batch or right after a commit, then restart
        point = rng.choice(["projector:before_commit", "projector:after_commit"])
        crash = f"{point}@{rng.randint(1, 3)}"
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "es_agents.cli",
                "projector",
                "--until-caught-up",
                "--instance-id",
                "p1",
                "--batch",
                str(rng.randint(5, 40)),
            ],
            env={**_base_env(), **env, "ES_AGENTS_CRASH_AT": crash},
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert result.returncode in (0, -9), result.stderr[-2000:]
        kills += result.returncode == -9
    final = subprocess.run(
        [
            sys.executable,
            "-m",
            "es_agents.cli",
            "projector",
            "--until-caught-up",
            "--instance-id",
            "p1",
        ],
        env={**_base_env(), **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert final.returncode == 0, final.stderr[-2000:]
    assert kills >= 1

    # The same log projected once, without crashes, into a second database.
    rebuilt = f"es_rebuild_{uuid.uuid4().hex[:10]}"
    dev_stack.postgres.create_database(rebuilt)
    rebuilt_url = fresh_db.rsplit("/", 1)[0] + f"/{rebuilt}"
    try:
        rebuild = _settings(kafka_settings, rebuilt_url, 5)
        _project(rebuild.model_copy(update={"projector_group": "rebuild"}))
        crashed, clean = _tables(fresh_db), _tables(rebuilt_url)
        assert len(clean["run_events"]) == total
        assert crashed == clean
    finally:
        dev_stack.postgres.drop_database(rebuilt)


def _base_env() -> dict[str, str]:
    import os  # noqa: PLC0415

    return dict(os.environ)


def _projected(
    kafka: KafkaSettings, settings: Settings, events: list[Event]
) -> tuple[KafkaEventLog, Database, PostgresProjections]:
    """``events`` appended and projected; the log and projections to load from."""
    log = KafkaEventLog(kafka)
    for start in range(0, len(events), 200):
        log.append(events[start : start + 200])
    _project(settings)
    db = Database(settings.database_url.get_secret_value())
    projections = PostgresProjections(
        db, log.decode_event, settings.projector_group_id, kafka.events_topic
    )
    return log, db, projections


def _patches(state: RunState, key: str, n: int) -> list[Event]:
    """``n`` state patches that follow the run's last event."""
    return [
        StatePatched(
            run_id=state.run_id,
            seq=state.seq + 1 + i,
            step=state.step,
            key=key,
            value_json=json.dumps(i),
        )
        for i in range(n)
    ]


def test_resume_reads_a_snapshot_and_at_most_k_events(
    kafka_settings: KafkaSettings, fresh_db: str
) -> None:
    k = 50
    settings = _settings(kafka_settings, fresh_db, k)
    run_id = f"run-long-{uuid.uuid4().hex[:6]}"
    events = script_of(run_id, random.Random(5), patches=730)
    log, db, projections = _projected(kafka_settings, settings, events)
    try:
        loaded = RunLoader(projections, log, kafka_settings.events_topic).load(run_id)
        assert loaded.state == replay(events)
        assert loaded.snapshot_seq is not None
        assert loaded.events_from_db < k
        assert loaded.events_from_log == 0
        # A snapshot this code cannot read (written by other code under the same
        # reducer version) is skipped: the projected events are read from the log
        # (the projection keeps the bytes of the tail only) and folded.
        with db.transaction() as conn:
            conn.execute(
                "UPDATE run_snapshots SET state = jsonb_set(state, "
                "'{versions,from_other_code}', '1') WHERE run_id = %s",
                (run_id,),
            )
        fallback = RunLoader(projections, log, kafka_settings.events_topic).load(run_id)
        assert fallback.state == replay(events)
        assert fallback.snapshot_seq is None
        assert fallback.events_from_db == 0
        assert fallback.events_from_log == len(events)
        with db.transaction() as conn:
            conn.execute(
                "UPDATE run_snapshots SET state = "
                "state #- '{versions,from_other_code}' WHERE run_id = %s",
                (run_id,),
            )
        # Events the projector has not seen come from the log, still exactly.
        state = loaded.state
        assert state is not None
        more = _patches(state, "late", 3)
        if state.terminal:
            return
        log.append(more)
        later = RunLoader(
            projections, log, kafka_settings.events_topic, wait_for_projector=0
        )
        again = later.load(run_id)
        assert again.events_from_log == 3
        assert again.state == replay(events + more)
    finally:
        db.close()
        log.close()


def test_the_projection_keeps_the_bytes_of_the_tail_only(
    kafka_settings: KafkaSettings, fresh_db: str
) -> None:
    """``run_events`` says where each event is; ``run_tails`` keeps the bytes from
    the latest snapshot on. A projector with no snapshot to start from (one this
    code cannot read) reads the run's projected events from the log and goes on."""
    k = 50
    settings = _settings(kafka_settings, fresh_db, k)
    run_id = f"run-tail-{uuid.uuid4().hex[:6]}"
    events = script_of(run_id, random.Random(7), patches=730)
    log, db, projections = _projected(kafka_settings, settings, events)
    try:
        with db.transaction() as conn:
            columns = {
                str(r[0])
                for r in conn.execute(
                    "SELECT column_name FROM information_schema.columns "
                    "WHERE table_name = 'run_events'"
                )
            }
            rows = conn.execute(
                "SELECT count(*) FROM run_events WHERE run_id = %s", (run_id,)
            ).fetchone()
            tail = conn.execute(
                "SELECT min(seq), max(seq), count(*) FROM run_tails WHERE run_id = %s",
                (run_id,),
            ).fetchone()
            snapshot = conn.execute(
                "SELECT max(seq) FROM run_snapshots WHERE run_id = %s", (run_id,)
            ).fetchone()
        assert "payload" not in columns
        assert "offset" in columns
        assert rows is not None
        assert rows[0] == len(events)
        assert tail is not None
        assert snapshot is not None
        assert snapshot[0] is not None
        assert tail[0] == snapshot[0]  # the snapshot's event: the chain's head
        assert tail[1] == len(events) - 1
        assert tail[2] == tail[1] - tail[0] + 1 <= k

        with db.transaction() as conn:
            conn.execute(
                "UPDATE run_snapshots SET state = jsonb_set(state, "
                "'{versions,from_other_code}', '1') WHERE run_id = %s",
                (run_id,),
            )
        more = _patches(replay(events), "later", 3)
        log.append(more)
        _project(settings)  # a new projector: nothing cached, no usable snapshot
        row = projections.run_row(run_id)
        assert row is not None
        assert row["last_seq"] == len(events) + 2
        loaded = RunLoader(projections, log, kafka_settings.events_topic).load(run_id)
        assert loaded.state == replay(events + more)
        assert loaded.events_from_log == len(events) + 3  # the history, then none
    finally:
        db.close()
        log.close()


def test_a_resumed_run_reads_its_transcript_only_when_asked_for(
    kafka_settings: KafkaSettings, fresh_db: str
) -> None:
    """O(K) resume for a long conversation: the snapshot's chain stands for the
    messages, which are read from their chunks when a model is sent them."""
    settings = _settings(kafka_settings, fresh_db, 50)
    run_id = f"run-chat-{uuid.uuid4().hex[:6]}"
    events = script(run_id, steps=150)[:-3]  # 300 messages; open, before the gate
    log, db, projections = _projected(kafka_settings, settings, events)
    try:
        loaded = RunLoader(projections, log, kafka_settings.events_topic).load(run_id)
        state, whole = loaded.state, replay(events)
        assert state is not None
        assert loaded.snapshot_seq is not None
        assert len(state.transcript) == len(whole.transcript) > 4 * CHUNK
        assert state.transcript.unread() >= 4 * CHUNK  # nothing read but the last
        assert state.transcript[-1] == whole.transcript[-1]
        head: list[Message] = [{"role": "system", "content": "s"}]
        asked = CallModel(Conversation(head, state.transcript), {}, ())
        wanted = CallModel(Conversation(head, whole.transcript), {}, ())
        assert request_hash(asked, "m") == request_hash(wanted, "m")
        assert state.transcript.unread() >= 4 * CHUNK  # hashed from the chain
        assert list(state.transcript) == list(whole.transcript)
        assert state.transcript.unread() == 0
        assert state == whole
        # A snapshot whose transcript is not all stored is not used.
        with db.transaction() as conn:
            conn.execute(
                "DELETE FROM run_transcripts WHERE run_id = %s AND chunk = 1",
                (run_id,),
            )
        again = RunLoader(projections, log, kafka_settings.events_topic).load(run_id)
        assert again.snapshot_seq is None
        assert again.state == whole
    finally:
        db.close()
        log.close()


def test_status_and_runs_read_the_projection(
    kafka_settings: KafkaSettings, fresh_db: str
) -> None:
    from es_agents.lab.demo import cli  # noqa: PLC0415

    logs = _write_interleaved(kafka_settings, runs=4, seed=21)
    settings = _settings(kafka_settings, fresh_db, 3)
    _project(settings)
    env = {
        "ES_AGENTS_BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
        "ES_AGENTS_TOPIC_PREFIX": kafka_settings.topic_prefix,
        "ES_AGENTS_PARTITIONS": str(kafka_settings.partitions),
        "ES_AGENTS_DATABASE_URL": fresh_db,
    }
    listed = cli(env, "runs", "--status", "completed", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    assert {r["run_id"] for r in rows} == set(logs)
    assert all(r["status"] == "completed" for r in rows)
    run_id = next(iter(logs))
    shown = cli(env, "status", run_id, "--json")
    assert shown.returncode == 0, shown.stderr
    summary = json.loads(shown.stdout)
    assert summary["status"] == "completed"
    assert summary["events"] == len(logs[run_id])
    assert summary["loaded_from"]["snapshot_seq"] == len(logs[run_id]) - 1
    assert summary["loaded_from"]["events_from_log"] == 0


def test_events_that_do_not_decode_or_fold_go_to_the_dlq_and_show_on_the_run(
    kafka_settings: KafkaSettings, fresh_db: str
) -> None:
    from confluent_kafka import Producer  # noqa: PLC0415

    from es_agents.client import Client  # noqa: PLC0415

    settings = _settings(kafka_settings, fresh_db, k=100)
    bad, good = f"run-bad-{uuid.uuid4().hex[:6]}", f"run-ok-{uuid.uuid4().hex[:6]}"
    events = script_of(bad, random.Random(3), patches=3)
    log = KafkaEventLog(kafka_settings)
    try:
        log.append(events[:2])  # seq 0, 1
        raw = Producer(
            {
                "bootstrap.servers": kafka_settings.bootstrap_servers,
                "partitioner": "murmur2_random",
            }
        )
        # Signed as a worker's record (one unsigned is left out, not dead-lettered).
        assert log.auth is not None
        raw.produce(
            kafka_settings.events_topic,
            key=bad,
            value=b"\x00garbage",
            headers=[log.auth.header(b"\x00garbage")],
        )
        assert raw.flush(10) == 0
        log.append([events[3]])  # seq 3 after seq 1: does not fold
        log.append(script_of(good, random.Random(4), patches=2))
    finally:
        log.close()
    _project(settings)
    with psycopg.connect(fresh_db) as conn:
        reasons = [
            r[0]
            for r in conn.execute(
                'SELECT reason FROM dead_letters WHERE run_id = %s ORDER BY "offset"',
                (bad,),
            )
        ]
        seqs = conn.execute(
            "SELECT last_seq FROM runs WHERE run_id IN (%s, %s) ORDER BY run_id",
            (bad, good),
        ).fetchall()
    assert len(reasons) == 2, reasons
    assert reasons[0].startswith("undecodable event")
    assert reasons[1].startswith(f"event does not fold: run {bad}: expected seq 2")
    assert seqs == [(1,), (2,)]  # the bad run stops where it broke; the rest goes on
    with Client(settings) as client:
        shown = client.status(bad)
    assert [r for *_, r in shown.dead_letters] == reasons
    # ...and es.dlq holds both records with the reason.
    dlq = Consumer(
        {
            "bootstrap.servers": kafka_settings.bootstrap_servers,
            "group.id": "dlq-check",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    dlq.subscribe([kafka_settings.dlq_topic])
    found: list[str] = []
    deadline = time.monotonic() + 20
    while len(found) < 2 and time.monotonic() < deadline:
        for msg in dlq.consume(10, timeout=0.5):
            if msg.error() is None and msg.key() == bad.encode():
                reason = dict(msg.headers() or [])["es.dlq.reason"]
                assert isinstance(reason, bytes)
                found.append(reason.decode())
    dlq.close()
    assert found == reasons


def test_rebuild_projects_the_whole_log_again(
    kafka_settings: KafkaSettings, fresh_db: str
) -> None:
    settings = _settings(kafka_settings, fresh_db, k=5)
    _write_interleaved(kafka_settings, runs=6, seed=11)
    _project(settings)
    before = _tables(fresh_db)
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("UPDATE runs SET status = 'tampered'")
    projector = build_projector(settings, batch_size=50)
    projector.reset()
    projector.run(until_caught_up=True, idle_seconds=0.3)
    assert _tables(fresh_db)["runs"] == before["runs"]
    assert _tables(fresh_db)["run_events"] == before["run_events"]
    # Another prefix projected into the same database: a rebuild would empty its
    # rows too (the tables are shared) and its projector would not redo them.
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO projector_offsets (group_id, topic, partition, next_offset) "
            "VALUES ('other.projector', 'other.events', 0, 7)"
        )
    with pytest.raises(ConfigError, match=r"other\.events: --rebuild empties"):
        build_projector(settings, batch_size=50).reset()
    assert _tables(fresh_db)["runs"] == before["runs"]  # nothing emptied


# Alone, after the parallel tests: under their load (three test processes) this
# test waited past the 600 s limit in two CI runs, each time after ~700 others,
# while alone and four at once beside two CPU hogs it takes 11-17 s. Its projectors
# are bounded, so when it hangs again here pytest-timeout's stacks say where.
@pytest.mark.serial
def test_a_projector_stalled_mid_batch_does_not_stop_the_next(
    kafka_settings: KafkaSettings, fresh_db: str
) -> None:
    """A projector paused between its batch's pipelined statements keeps its row
    locks (the partitions' stored offsets here) in a session the server never calls
    idle: the next projector ends that session after the session timeout and
    projects on, instead of waiting forever."""
    kafka = kafka_settings.model_copy(update={"session_timeout_ms": 6000})
    settings = _settings(kafka, fresh_db, k=5)
    first = _write_interleaved(kafka, runs=3, seed=31)
    assert _project(settings) == sum(len(v) for v in first.values())
    more = _write_interleaved(kafka, runs=3, seed=32)
    stalled = stalled_session(fresh_db, "SELECT * FROM projector_offsets FOR UPDATE")
    try:
        # Bounded: a projector that waits for the lock would wait forever.
        assert _project(settings, within=120) == sum(len(v) for v in more.values())
        assert stalled.info.backend_pid not in server_sessions(fresh_db)
    finally:
        stalled.close()
    with psycopg.connect(fresh_db) as conn:
        for run_id, events in more.items():
            row = conn.execute(
                "SELECT last_seq FROM runs WHERE run_id = %s", (run_id,)
            ).fetchone()
            assert row == (events[-1].seq,)
