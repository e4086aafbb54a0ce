"""Retention on the real stack: finished runs archived to the S3 server as Avro
object container files and their Postgres rows purged; a payload object shared by
two runs kept until neither claims it; a late approval and a start with the same id
refused by name, nothing lost; status, show and audit of a purged run; restore; and
a worker that archives its agent's runs once they ended a second ago."""

from __future__ import annotations

import io
import json
import uuid
from pathlib import Path
from typing import Any

import fastavro
import psycopg
import pytest

from es_agents.adapters.kafka import KafkaEventLog
from es_agents.adapters.s3 import S3BlobStore
from es_agents.core.commands import Approve, StartRun
from es_agents.dev import DevStack
from es_agents.errors import PayloadUnavailable
from es_agents.lab.demo import cli, run_worker
from es_agents.settings import KafkaSettings
from tests.integration.test_commands import until, worker
from tests.integration.test_rebalance import _spawn

pytestmark = pytest.mark.integration


def _store(stack: DevStack) -> S3BlobStore:
    d = stack.dev
    return S3BlobStore(d.s3_endpoint, d.s3_bucket, d.s3_access_key, d.s3_secret_key)


def _json(env: dict[str, str], *args: str, code: int = 0) -> Any:
    done = cli(env, *args, "-o", "json")
    assert done.returncode == code, (args, done.stdout[-2000:], done.stderr[-2000:])
    return json.loads(done.stdout)


def _rows(env: dict[str, str], table: str, value: str, column: str = "run_id") -> int:
    with psycopg.connect(env["ES_AGENTS_DATABASE_URL"]) as conn:
        row = conn.execute(
            f"SELECT count(*) FROM {table} WHERE {column} = %s",  # noqa: S608
            (value,),
        ).fetchone()
    return int(row[0]) if row else 0


def _blob_key(env: dict[str, str], run_id: str) -> str:
    with psycopg.connect(env["ES_AGENTS_DATABASE_URL"]) as conn:
        row = conn.execute(
            "SELECT key FROM payload_refs WHERE run_id = %s", (run_id,)
        ).fetchone()
    assert row is not None, f"{run_id} claims no payload object"
    return str(row[0])


def _exists(store: S3BlobStore, key: str) -> bool:
    try:
        store.get(key)
    except PayloadUnavailable:
        return False
    return True


def test_archive_purge_refuse_restore(  # noqa: PLR0915 - one scenario
    env: dict[str, str], kafka_settings: KafkaSettings, dev_stack: DevStack
) -> None:
    env = {
        **env,
        "ES_AGENTS_PAYLOAD_THRESHOLD": "1024",
        "ES_AGENTS_PAYLOAD_DELETE_GRACE_HOURS": "0",  # its objects are seconds old
    }
    store = _store(dev_stack)
    first, second = (f"run-{uuid.uuid4().hex[:8]}" for _ in range(2))
    for run_id in (first, second):
        started = cli(env, "start", "archivist", "--run-id", run_id, "--queue")
        assert started.returncode == 0, started.stderr
    done = run_worker(env, agent="tests.agents:archivist", instance_id="")
    assert done.returncode == 0, done.stderr[-3000:]
    assert cli(env, "projector", "--until-caught-up").returncode == 0
    assert _json(env, "status", first)["status"] == "completed"
    shown_before = _json(env, "show", first)
    # Equal results, one object: both runs claim it.
    blob = _blob_key(env, first)
    assert blob == _blob_key(env, second)
    events = _rows(env, "run_events", first)
    assert events >= 5

    archived = _json(env, "archive", first)
    assert archived["events"] == events
    assert archived["purged"] is True
    assert archived["deleted_objects"] == 0  # the second run still claims it
    assert _exists(store, blob)
    for table in ("run_events", "run_snapshots", "run_transcripts", "payload_refs"):
        assert _rows(env, table, first) == 0, table
    assert _rows(env, "runs", first) == 1  # the row that says it existed
    # The archive: fastavro alone reads it.
    data = store.get(str(archived["archive"]))
    records: list[dict[str, Any]] = [
        dict(r)  # type: ignore[arg-type]
        for r in fastavro.reader(io.BytesIO(data))
    ]
    assert [r["seq"] for r in records] == list(range(events))
    assert any(r["payloads"] for r in records)

    # A purged run: status says so, show reads the archive, commands are refused.
    status = _json(env, "status", first)
    assert status["status"] == "completed"
    assert status["archived"] == archived["archive"]
    assert _json(env, "show", first) == shown_before
    late = cli(env, "approve", first, "--by", "ann")
    assert late.returncode == 1, late.stderr
    assert f"run {first} is archived" in late.stderr
    again = cli(env, "start", "archivist", "--run-id", first, "--queue")
    assert again.returncode == 1
    assert "already" in again.stderr
    # Commands sent past the client's check (straight to the topic): the worker
    # refuses each by name -- a start with the id does not begin the run anew.
    log = KafkaEventLog(kafka_settings)
    try:
        log.send(Approve(run_id=first, by="ann"))
        log.send(StartRun(run_id=first, agent="archivist", input_json='"again"'))
    finally:
        log.close()

    def refusals() -> list[str]:
        found = _json(env, "status", first).get("refused_commands", [])
        return [f"{r['command']}: {r['reason']}" for r in found]

    with worker(env, "tests.agents:archivist"):
        until(lambda: len(refusals()) >= 2, what=lambda: f"refused: {refusals()}")
    assert all(f"run {first} is archived" in r for r in refusals()), refusals()
    assert _rows(env, "run_events", first) == 0  # nothing started, nothing added
    assert _json(env, "audit")["problem_count"] == 0

    # The second run's purge leaves the object nobody claims any more while it
    # is younger than the grace period (a run still going may have just stored
    # the same bytes); a worker's sweep deletes it once it is past.
    kept = {**env, "ES_AGENTS_PAYLOAD_DELETE_GRACE_HOURS": "24"}
    assert _json(kept, "archive", second)["deleted_objects"] == 0
    assert _exists(store, blob)
    assert _rows(env, "payload_orphans", blob, column="key") == 1
    swept = {**env, "ES_AGENTS_RETENTION_EVERY_SECONDS": "0.5"}
    with worker(swept, "tests.agents:archivist"):
        until(lambda: not _exists(store, blob), what="the orphan deleted")
    assert _rows(env, "payload_orphans", blob, column="key") == 0
    assert _json(env, "audit")["problem_count"] == 0

    # Restore: rows and payload back, read as before.
    restored = _json(env, "restore", first)
    assert restored["restored_events"] == events
    assert _exists(store, blob)
    assert _rows(env, "run_events", first) == events
    view = _json(env, "status", first)
    assert view["status"] == "completed"
    assert "archived" not in view
    assert _json(env, "show", first) == shown_before
    replayed = cli(env, "replay", first)
    assert replayed.returncode == 0, replayed.stderr
    # Archiving again: the archive made before is used, the rows purged again.
    assert _json(env, "archive", first)["purged"] is True
    # An unfinished or unknown run is not archived.
    missing = cli(env, "archive", "run-nope")
    assert missing.returncode == 3, missing.stderr


def test_a_worker_archives_runs_its_agent_keeps_briefly(
    env: dict[str, str], tmp_path: Path
) -> None:
    env = {
        **env,
        "ES_AGENTS_PAYLOAD_THRESHOLD": "1024",
        "ES_AGENTS_RETENTION_EVERY_SECONDS": "0.5",
    }
    runs = [f"run-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    projector = _spawn(env, tmp_path / "projector.log", "projector")
    try:
        with worker(env, "tests.agents:archivist_brief"):
            for run_id in runs:
                done = cli(env, "start", "archivist-brief", "--run-id", run_id)
                assert done.returncode == 0, done.stderr
            until(
                lambda: (
                    all(_rows(env, "run_archives", r) for r in runs)
                    and all(_rows(env, "run_events", r) == 0 for r in runs)
                ),
                seconds=90,
                what=lambda: (
                    "archived and purged: "
                    + str({r: _rows(env, "run_events", r) for r in runs})
                ),
            )
    finally:
        projector.terminate()
        projector.wait(30)
    for run_id in runs:
        assert _json(env, "status", run_id)["archived"]
    assert _json(env, "audit")["problem_count"] == 0
