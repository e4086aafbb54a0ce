"""``es-agents fork``: a new run from another's prefix, with the origin's recorded
completions and none of its effects; the origin untouched."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from es_agents.app import build_client_ports
from es_agents.core.chain import Sealed, digest
from es_agents.core.events import (
    Forked,
    Interrupted,
    ModelResponded,
    ToolCallRequested,
)
from es_agents.lab.demo import cli, run_worker, ticket_stats
from es_agents.settings import load_settings

pytestmark = pytest.mark.integration

AGENT = "tests.agents:gated"


def _read(env: dict[str, str], run_id: str) -> list[Sealed]:
    settings = load_settings(
        bootstrap_servers=env["ES_AGENTS_BOOTSTRAP_SERVERS"],
        topic_prefix=env["ES_AGENTS_TOPIC_PREFIX"],
        partitions=int(env["ES_AGENTS_PARTITIONS"]),
        database_url=env["ES_AGENTS_DATABASE_URL"],
    )
    ports = build_client_ports(settings)
    try:
        return ports.log.read_sealed(run_id)
    finally:
        ports.close()


def _calls(env: dict[str, str]) -> int:
    path = Path(env["ES_AGENTS_MODEL_CALLS_LOG"])
    return len(path.read_text().splitlines()) if path.exists() else 0


def _fork(env: dict[str, str], *args: str) -> tuple[int, dict[str, object]]:
    done = cli(env, "fork", *args, "--json")
    return done.returncode, json.loads(done.stdout.splitlines()[-1])


def test_a_fork_keeps_the_prefix_and_makes_its_own_effects(
    env: dict[str, str], tickets_url: str
) -> None:
    origin = f"origin-{uuid.uuid4().hex[:6]}"
    started = cli(env, "start", "research", "--queue", "--run-id", origin, "--no-wait")
    assert started.returncode == 0, started.stderr[-2000:]
    assert run_worker(env, agent=AGENT).returncode == 0  # to the ticket's gate
    before = _read(env, origin)
    gate = next(s.event for s in before if isinstance(s.event, Interrupted))
    calls_before = _calls(env)
    prefix_calls = sum(isinstance(s.event, ModelResponded) for s in before)
    assert calls_before == prefix_calls

    fork = f"fork-{uuid.uuid4().hex[:6]}"
    code, result = _fork(
        env, origin, "--at", str(gate.seq), "--run-id", fork, "--by", "ann"
    )
    assert code == 0, result  # queued (no worker up) or applied
    assert run_worker(env, agent=AGENT).returncode == 0  # applies the fork
    for run_id in (origin, fork):
        approved = cli(env, "approve", run_id, "--by", "alice", "--no-wait")
        assert approved.returncode == 0, approved.stderr[-2000:]
    assert run_worker(env, agent=AGENT).returncode == 0

    origin_after = _read(env, origin)
    forked = _read(env, fork)
    # The origin is untouched: its prefix is byte for byte what it was.
    assert [s.value for s in origin_after[: len(before)]] == [s.value for s in before]
    # The fork's log: the origin's prefix under the fork's id, then `forked`.
    copies = forked[: gate.seq + 1]
    assert [s.event.seq for s in copies] == list(range(gate.seq + 1))
    assert all(s.event.run_id == fork for s in forked)
    for copy, original in zip(copies, before, strict=True):
        assert type(copy.event) is type(original.event)
        assert copy.event.event_id != original.event.event_id
    mark = forked[gate.seq + 1].event
    assert isinstance(mark, Forked)
    assert (mark.origin_run, mark.origin_seq, mark.by) == (origin, gate.seq, "ann")
    assert mark.origin_head == digest(before[gate.seq].value)
    # Its own idempotency keys: no effect of the origin reused or repeated.
    keys = [
        s.event.idempotency_key
        for s in forked
        if isinstance(s.event, ToolCallRequested)
    ]
    assert keys
    assert all(k.startswith(f"{fork}:") for k in keys)
    assert ticket_stats(tickets_url, origin) == {"tickets": 1, "keys": 1}
    assert ticket_stats(tickets_url, fork) == {"tickets": 1, "keys": 1}
    # The prefix's completions were kept: the model was asked only after the fork.
    fork_calls = sum(isinstance(s.event, ModelResponded) for s in forked)
    origin_calls = sum(isinstance(s.event, ModelResponded) for s in origin_after)
    assert _calls(env) == origin_calls + (fork_calls - prefix_calls)

    assert cli(env, "projector", "--until-caught-up").returncode == 0
    replayed = cli(env, "replay", fork, "--json")
    summary = json.loads(replayed.stdout.splitlines()[-1])["summary"]
    assert replayed.returncode == 0, summary
    assert summary["status"] == "completed"
    assert summary["chain"]["intact"] is True
    status = cli(env, "status", fork, "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["forked_from"] == f"{origin}@{gate.seq}"


def test_forks_that_cannot_be_made_are_refused_with_the_reason(
    env: dict[str, str],
) -> None:
    origin = f"origin-{uuid.uuid4().hex[:6]}"
    assert (
        cli(
            env, "start", "research", "--queue", "--run-id", origin, "--no-wait"
        ).returncode
        == 0
    )
    assert run_worker(env, agent=AGENT).returncode == 0
    assert cli(env, "approve", origin, "--by", "alice", "--no-wait").returncode == 0
    assert run_worker(env, agent=AGENT).returncode == 0
    origin_after = _read(env, origin)

    code, result = _fork(env, "no-such-run", "--at", "0")
    assert (code, result["kind"]) == (3, "not_found"), result  # no such origin
    assert "unknown run no-such-run" in str(result["error"])
    last = origin_after[-1].event.seq
    code, result = _fork(env, origin, "--at", str(last + 5))
    assert code == 1
    assert f"has no seq {last + 5}" in str(result["reason"])
    code, result = _fork(env, origin, "--at", "1", "--run-id", origin)
    assert code == 1
    assert "already exists" in str(result["reason"])
    code, result = _fork(env, origin, "--at", str(last), "--no-wait")
    assert code == 0, result  # the worker refuses it: the run had ended there
    refused_fork = str(result["run_id"])
    assert run_worker(env, agent=AGENT).returncode == 0
    status = cli(env, "status", refused_fork, "--json")
    assert status.returncode == 3  # no such run: only its refused fork
    assert "completed at seq" in status.stdout + status.stderr
