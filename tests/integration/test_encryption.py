"""Encryption at rest and crypto-shredding on the real stack.

An encrypted agent's run carries a marker in its input, its model's tool call, the
tool's result (claim-checked to the object store at a 1 KB threshold, and kept in
the dedupe table) and its output. The marker is in no topic, table, object or
process log in plain text; a client with the master key reads it back. After
``es-agents forget`` nothing reads it back: payloads say ``(forgotten)`` while the
run's structure, hash chain and status stay, and replay and audit still pass.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import boto3
import psycopg
import pytest
from confluent_kafka import Consumer, TopicPartition

from es_agents.lab.demo import _env, cli
from es_agents.settings import Settings
from es_agents.vault import FORGOTTEN, new_master_key
from tests.integration.test_commands import until, worker
from tests.test_support import ROOT

pytestmark = pytest.mark.integration
CLI = (sys.executable, "-m", "es_agents.cli")
AGENTS = "tests.secure_agents"


def _in_topics(env: dict[str, str], marker: bytes) -> list[str]:
    prefix = env["ES_AGENTS_TOPIC_PREFIX"]
    consumer = Consumer(
        {
            "bootstrap.servers": env["ES_AGENTS_BOOTSTRAP_SERVERS"],
            "group.id": f"scan-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
        }
    )
    found = []
    try:
        topics = consumer.list_topics(timeout=10).topics
        for name, meta in topics.items():
            if not name.startswith(prefix + "."):
                continue
            for p in meta.partitions:
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(name, p), timeout=10
                )
                if high <= low:
                    continue
                consumer.assign([TopicPartition(name, p, low)])
                seen = low
                while seen < high:
                    msg = consumer.poll(10)
                    assert msg is not None, f"{name}[{p}] did not read to {high}"
                    if msg.error():
                        continue
                    raw = (msg.value() or b"") + (msg.key() or b"")
                    for header in msg.headers() or []:
                        value = header[1]
                        raw += value if isinstance(value, bytes) else b""
                    if marker in raw:
                        found.append(f"{name}[{p}]@{msg.offset()}")
                    seen = (msg.offset() or 0) + 1
    finally:
        consumer.close()
    return found


def _in_tables(database_url: str, marker: bytes) -> list[str]:
    found = []
    with psycopg.connect(database_url) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
            )
        ]
        for table in tables:
            for row in conn.execute(f'SELECT * FROM "{table}"'):  # noqa: S608
                for value in row:
                    if marker in _bytes(value):
                        found.append(table)
    return found


def _bytes(value: Any) -> bytes:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, dict | list):
        return json.dumps(value).encode()
    return str(value).encode()


def _in_objects(marker: bytes) -> tuple[list[str], int]:
    settings = Settings()
    s3 = boto3.client(
        "s3",
        endpoint_url=settings.s3_endpoint,
        aws_access_key_id=settings.s3_access_key,
        aws_secret_access_key=settings.s3_secret_key.get_secret_value(),
        region_name="us-east-1",
    )
    found, scanned = [], 0
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=settings.s3_bucket):
        for obj in page.get("Contents", []):
            body = s3.get_object(Bucket=settings.s3_bucket, Key=obj["Key"])["Body"]
            scanned += 1
            if marker in body.read():
                found.append(obj["Key"])
    return found, scanned


def _status(env: dict[str, str], run: str) -> dict[str, Any]:
    done = cli(env, "status", run, "-o", "json")
    assert done.returncode == 0, done.stderr[-2000:]
    value = json.loads(done.stdout)
    assert isinstance(value, dict)
    return value


def _run_to_end(env: dict[str, str], agent: str, log: Path, *start: str) -> str:
    """Start a run of ``tests.secure_agents:<agent>`` with a worker logging at debug
    to ``log``, wait for its completion, project it; its id."""
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*CLI, "--log-level", "debug", "worker", "--agent", f"{AGENTS}:{agent}"],
            cwd=ROOT,
            env=_env(**env),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            started = cli(env, "start", agent, *start, "-o", "json")
            assert started.returncode == 0, started.stderr[-2000:]
            run = str(json.loads(started.stdout)["run_id"])
            until(lambda: _status(env, run)["status"] == "completed", what="the end")
        finally:
            proc.terminate()
            proc.wait(60)
    projected = cli(env, "projector", "--until-caught-up")
    assert projected.returncode == 0, projected.stderr[-2000:]
    return run


def _no_plaintext(
    env: dict[str, str],
    without_key: dict[str, str],
    database_url: str,
    run: str,
    secret: str,
) -> None:
    marker = secret.encode()
    assert secret in json.dumps(_status(env, run))  # the master key reads it back
    blind = json.dumps(_status(without_key, run))
    assert "(encrypted)" in blind
    assert secret not in blind
    assert _in_topics(env, marker) == []
    assert _in_tables(database_url, marker) == []
    assert _in_topics(env, run.encode())  # the scans see what is in plain text
    assert "runs" in _in_tables(database_url, run.encode())
    objects, scanned = _in_objects(marker)
    assert objects == []
    assert scanned > 0  # the tool's result went to the object store
    with psycopg.connect(database_url) as conn:
        sealed = conn.execute(
            "SELECT count(*) FROM run_transcripts WHERE run_id = %s", (run,)
        ).fetchone()
    assert sealed is not None
    assert sealed[0] > 0  # projected: the transcript holds ciphertext


def test_no_plaintext_anywhere_and_forget_shreds_it(
    env: dict[str, str], database_url: str, tmp_path: Path
) -> None:
    secret = f"MARKER-{uuid.uuid4().hex}"
    env = {
        **env,
        "ES_AGENTS_MASTER_KEY": new_master_key(),
        "ES_AGENTS_PAYLOAD_THRESHOLD": "1024",
        "ES_AGENTS_SNAPSHOT_EVERY": "2",
    }
    without_key = {k: v for k, v in env.items() if k != "ES_AGENTS_MASTER_KEY"}
    refused = cli(without_key, "worker", "--agent", "tests.secure_agents:sealed")
    assert refused.returncode != 0
    assert "ES_AGENTS_MASTER_KEY" in refused.stderr
    log = tmp_path / "worker.log"
    run = _run_to_end(env, "sealed", log, "--input", json.dumps({"secret": secret}))

    _no_plaintext(env, without_key, database_url, run, secret)
    assert secret.encode() not in log.read_bytes()
    # A client without the master key: before, it sent the input in plain text to
    # the commands topic (which never expires); now the agent's workers said it
    # encrypts, and the client refuses before sending anything.
    plain = cli(without_key, "start", "sealed", "--input", json.dumps({"s": secret}))
    assert plain.returncode == 1, plain.stdout + plain.stderr
    assert "has no master key" in plain.stdout + plain.stderr
    forgot = cli(env, "forget", run, "-o", "json")
    assert forgot.returncode == 0, forgot.stderr[-2000:]
    assert json.loads(forgot.stdout) == {"run_id": run, "forgotten": True}
    assert cli(env, "forget", run).returncode == 1  # nothing left to forget
    after = _status(env, run)
    assert after["status"] == "completed"  # structure and status stay
    assert secret not in json.dumps(after)
    assert FORGOTTEN in json.dumps(after)
    replayed = cli(env, "replay", run, "-o", "json")
    assert replayed.returncode == 0, replayed.stdout[-2000:] + replayed.stderr
    summary = json.loads(replayed.stdout)["summary"]
    assert summary["chain"]["intact"]
    assert any("forgotten" in note for note in summary["notes"])
    audited = cli(env, "audit", "--run-prefix", run, "--no-bare", "-o", "json")
    assert audited.returncode == 0, audited.stdout[-2000:] + audited.stderr
    assert json.loads(audited.stdout)["forgotten"] == [run]
    with psycopg.connect(database_url) as conn:
        key = conn.execute(
            "SELECT wrapped, forgotten_at FROM run_keys WHERE run_id = %s", (run,)
        ).fetchone()
    assert key is not None
    assert key[0] is None
    assert key[1] is not None


def test_secret_fields_are_sealed_on_the_real_stack(
    env: dict[str, str], database_url: str, tmp_path: Path
) -> None:
    """A password the model puts in a tool's SecretStr argument and a token a tool
    returns as SecretStr: in no topic, table or object, not in the CLI's output nor
    the worker's log -- and the tools received the real values."""
    from tests.secure_agents import PASSWORD, TOKEN  # noqa: PLC0415

    env = {**env, "ES_AGENTS_MASTER_KEY": new_master_key()}
    log = tmp_path / "worker.log"
    run = _run_to_end(env, "secretive", log)
    timeline = cli(env, "show", run, "-o", "jsonl").stdout
    results = [
        json.loads(entry["result"])
        for entry in map(json.loads, timeline.splitlines())
        if entry["type"] == "tool_returned"
    ]
    assert results[-1] == {"token_ok": True}  # whoami got the real token
    shown = timeline + json.dumps(_status(env, run))
    for secret in (PASSWORD, TOKEN):
        marker = secret.encode()
        assert _in_topics(env, marker) == []
        assert _in_tables(database_url, marker) == []
        assert _in_objects(marker)[0] == []
        assert secret not in shown
        assert marker not in log.read_bytes()


def _until_status(env: dict[str, str], run: str, status: str) -> None:
    until(lambda: _status(env, run)["status"] == status, what=f"{run} {status}")


def test_reasons_and_comments_are_sealed_too(
    env: dict[str, str], database_url: str
) -> None:
    """Before: a rejection's or a cancel's reason and an approval's comment stayed in
    plain text in the commands topic (which never expires) and, for a cancel, in
    the run's ``run_failed`` and its row, after ``forget`` too; a rejection's reason
    told to the model stayed plain in ``tool_returned.error``. Now a client with the
    master key seals them like the input, and the worker writes the failure's
    message and a call's error encrypted; one without the key may not send them to
    such an agent."""
    marker = f"MARKER-{uuid.uuid4().hex}"
    env = {**env, "ES_AGENTS_MASTER_KEY": new_master_key()}
    without_key = {k: v for k, v in env.items() if k != "ES_AGENTS_MASTER_KEY"}
    runs = []
    with worker(env, f"{AGENTS}:sealed_gate"):
        for _ in range(4):
            started = cli(env, "start", "sealed-gate", "-o", "json")
            assert started.returncode == 0, started.stderr[-2000:]
            runs.append(str(json.loads(started.stdout)["run_id"]))
        for run in runs:
            _until_status(env, run, "paused")
        decided = [
            cli(env, "reject", runs[0], "--by", "lead", "--reason", f"{marker}-r"),
            cli(env, "approve", runs[1], "--by", "lead", "--comment", f"{marker}-c"),
            cli(env, "cancel", runs[2], "--by", "lead", "--reason", f"{marker}-x"),
        ]
        for done in decided:
            assert done.returncode == 0, done.stdout + done.stderr
        for run, status in zip(
            runs[:3], ("completed", "completed", "cancelled"), strict=True
        ):
            _until_status(env, run, status)
        plain = cli(without_key, "cancel", runs[3], "--by", "lead", "--reason", "x")
        assert plain.returncode == 1, plain.stdout + plain.stderr
        assert "has no master key" in plain.stdout + plain.stderr
    projected = cli(env, "projector", "--until-caught-up")
    assert projected.returncode == 0, projected.stderr[-2000:]
    assert _in_topics(env, marker.encode()) == []
    assert _in_tables(database_url, marker.encode()) == []
    assert f"{marker}-x" in json.dumps(_status(env, runs[2]))  # the key reads it
    assert f"{marker}-x" not in json.dumps(_status(without_key, runs[2]))
