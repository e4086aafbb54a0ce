"""Tamper evidence: runs written by the runtime (through a gate and a resume), copied
to a scratch topic with one tampering each, are caught by ``replay`` and ``audit``;
the untouched copy passes both."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from es_agents.app import build_client_ports
from es_agents.codec import AvroCodec
from es_agents.core.events import StatePatched
from es_agents.errors import DecodeError
from es_agents.lab.demo import cli, run_worker
from es_agents.partitioner import partition_for
from es_agents.ports import Record
from es_agents.settings import load_settings
from tests.integration.test_postgres_store import pg  # noqa: F401 - a fixture

pytestmark = pytest.mark.integration

Tamper = Callable[[list[Record], list[Record]], list[tuple[str, bytes]]]
CODEC = AvroCodec()


def _altered_byte(run: list[Record], other: list[Record]) -> list[tuple[str, bytes]]:
    """One byte of a tool's result changed: still decodes, says something else."""
    out = [(r.key or "", r.value) for r in run]
    for i, (key, value) in enumerate(out):
        at = value.find(b"ticket")
        if at > 0 and i < len(out) - 1:
            out[i] = (key, value[:at] + b"T" + value[at + 1 :])
            CODEC.decode_event(out[i][1])  # the edit is silent to the decoder
            return out
    raise AssertionError("no tool result to alter")


def _dropped(run: list[Record], other: list[Record]) -> list[tuple[str, bytes]]:
    out = [(r.key or "", r.value) for r in run]
    del out[3]
    return out


def _swapped(run: list[Record], other: list[Record]) -> list[tuple[str, bytes]]:
    out = [(r.key or "", r.value) for r in run]
    out[3], out[4] = out[4], out[3]
    return out


def _spliced(run: list[Record], other: list[Record]) -> list[tuple[str, bytes]]:
    """Another run's event, re-encoded as this run's at the same seq: the seqs
    stay contiguous, only the chain notices."""
    out = [(r.key or "", r.value) for r in run]
    foreign = CODEC.decode_event(other[3].value)
    mine = CODEC.decode_event(out[3][1])
    moved = foreign.model_copy(update={"run_id": mine.run_id, "seq": mine.seq})
    out[3] = (out[3][0], CODEC.encode(moved))
    return out


def _rewritten_tail(run: list[Record], other: list[Record]) -> list[tuple[str, bytes]]:
    """The last event replaced by a well-formed one naming the right predecessor:
    the chain would hold, but it has no writer MAC: left out, the log ends a seq
    before the projection."""
    out = [(r.key or "", r.value) for r in run]
    last = CODEC.decode_event(out[-1][1])
    forged = StatePatched(
        run_id=last.run_id,
        seq=last.seq,
        step=last.step,
        at=last.at,
        prev=last.prev,
        key="output",
        value_json='"forged"',
    )
    out[-1] = (out[-1][0], CODEC.encode(forged))
    return out


def _untouched(run: list[Record], other: list[Record]) -> list[tuple[str, bytes]]:
    return [(r.key or "", r.value) for r in run]


CASES: dict[str, tuple[Tamper, str]] = {
    "clean": (_untouched, ""),
    "altered": (_altered_byte, "hash chain broken"),
    "dropped": (_dropped, "hash chain broken"),
    "swapped": (_swapped, "hash chain broken"),
    "spliced": (_spliced, "hash chain broken"),
    "tail": (_rewritten_tail, "runs.last_seq"),
}


@pytest.mark.parametrize("store", ["kafka", "postgres"])
def test_replay_and_audit_catch_each_tampering(
    store: str, env: dict[str, str], tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if store == "postgres":  # the log in a database of the test's own, no broker
        env = request.getfixturevalue("pg")[1]
    tag = uuid.uuid4().hex[:6]
    runs: dict[str, str] = {}
    for case in CASES:
        run_id = f"tamper-{tag}-{case}"
        started = cli(
            env,
            "start",
            "research",
            "--queue",
            "--run-id",
            run_id,
            "--input",
            '{"topic": "audit"}',
            "--no-wait",
        )
        assert started.returncode == 0, started.stderr[-2000:]
        runs[case] = run_id
    assert run_worker(env, agent="tests.agents:gated").returncode == 0
    for run_id in runs.values():
        approved = cli(env, "approve", run_id, "--by", "alice", "--no-wait")
        assert approved.returncode == 0, approved.stderr[-2000:]
    assert run_worker(env, agent="tests.agents:gated").returncode == 0
    assert cli(env, "projector", "--until-caught-up").returncode == 0
    # The runtime's chain holds across the pause and the resume, on every run.
    whole = tmp_path / "before.json"
    done = cli(env, "audit", "--run-prefix", f"tamper-{tag}-", "--report", str(whole))
    report = json.loads(whole.read_text())
    assert done.returncode == 0, report["problems"]
    assert report["statuses"] == {"completed": len(CASES)}

    scratch = {**env, "ES_AGENTS_TOPIC_PREFIX": env["ES_AGENTS_TOPIC_PREFIX"] + "-x"}
    assert cli(scratch, "topics").returncode == 0
    _copy(env, scratch, runs, store)

    for case, (_, expected) in CASES.items():
        done = cli(scratch, "replay", runs[case], "--json")
        summary = json.loads(done.stdout.splitlines()[-1])["summary"]
        if not expected:
            assert done.returncode == 0, summary
            continue
        assert done.returncode == 1, (case, summary)
        assert expected in str(summary["mismatch"]), (case, summary)

    report_file = tmp_path / "audit.json"
    audited = cli(
        scratch, "audit", "--run-prefix", f"tamper-{tag}-", "--report", str(report_file)
    )
    assert audited.returncode == 1, audited.stderr[-2000:]
    problems = json.loads(report_file.read_text())["problems"]
    assert runs["clean"] not in problems
    for case, (_, expected) in CASES.items():
        if expected:
            found = problems[runs[case]]
            audit_expects = "left out" if case == "tail" else expected
            assert any(audit_expects in p for p in found), (case, problems)


def _copy(
    env: dict[str, str], scratch: dict[str, str], runs: dict[str, str], store: str
) -> None:
    """Each run's records, as written, to the scratch topic with its tampering."""
    source = build_client_ports(load_settings(**_settings(env, store)))
    target = build_client_ports(load_settings(**_settings(scratch, store)))
    try:
        partitions = source.log.partition_count()
        records: dict[str, list[Record]] = {}
        events_topic = f"{env['ES_AGENTS_TOPIC_PREFIX']}.events"
        for partition in range(partitions):
            for record in source.log.read_partition(events_topic, partition):
                records.setdefault(record.key or "", []).append(record)
        other = records[runs["clean"]]
        # A record copied as written keeps its writer MAC; an edited one has none.
        macs = {r.value: r.headers for rs in records.values() for r in rs}
        scratch_topic = f"{scratch['ES_AGENTS_TOPIC_PREFIX']}.events"
        for case, (tamper, _) in CASES.items():
            copied = tamper(records[runs[case]], other)
            if store == "kafka":
                for key, value in copied:
                    target.log.produce(scratch_topic, key, value, macs.get(value, ()))
            else:
                _insert(
                    env["ES_AGENTS_DATABASE_URL"],
                    scratch_topic,
                    partitions,
                    [(k, v, macs.get(v, ())) for k, v in copied],
                )
    finally:
        source.close()
        target.close()


def _insert(
    url: str,
    topic: str,
    partitions: int,
    records: list[tuple[str, bytes, tuple[tuple[str, bytes], ...]]],
) -> None:
    """Rows of the Postgres store's log, as an operator with SQL access would write
    them (each event's seq from its own bytes)."""
    with psycopg.connect(url) as conn:
        for key, value, headers in records:
            partition = partition_for(key, partitions)
            row = conn.execute(
                "UPDATE log_heads SET next_offset = next_offset + 1 WHERE topic = %s "
                "AND partition = %s RETURNING next_offset - 1",
                (topic, partition),
            ).fetchone()
            assert row is not None
            conn.execute(
                'INSERT INTO log_records (topic, partition, "offset", key, seq, value, '
                "headers) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                (
                    topic,
                    partition,
                    row[0],
                    key,
                    _seq(value),
                    value,
                    json.dumps({k: v.decode() for k, v in headers})
                    if headers
                    else None,
                ),
            )


def _seq(value: bytes) -> int | None:
    """The event's seq, from its own bytes (garbage has none)."""
    with contextlib.suppress(DecodeError):
        return CODEC.decode_event(value).seq
    return None


def _settings(env: dict[str, str], store: str) -> dict[str, object]:
    return {
        "bootstrap_servers": env["ES_AGENTS_BOOTSTRAP_SERVERS"],
        "topic_prefix": env["ES_AGENTS_TOPIC_PREFIX"],
        "partitions": int(env["ES_AGENTS_PARTITIONS"]),
        "database_url": env["ES_AGENTS_DATABASE_URL"],
        "store": store,
    }
