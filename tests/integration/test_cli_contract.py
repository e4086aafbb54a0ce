"""The command line's contract and the client it is built on.

Every command speaks ``-o json`` (errors too: ``{"error", "kind"}``), times are
ISO-8601 UTC, and the exit code says what happened: 0 ok, 1 refused or mismatch,
2 usage, 3 not found, 4 unavailable -- within the connect timeout, in one line.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from es_agents.async_client import AsyncClient
from es_agents.client import Client
from es_agents.core.events import RunStarted
from es_agents.errors import NotFound
from es_agents.lab.demo import _env, cli
from es_agents.settings import KafkaSettings, Settings
from tests.integration.test_commands import _kafka, until, worker
from tests.test_support import free_port

pytestmark = pytest.mark.integration


def _json(done: subprocess.CompletedProcess[str], code: int = 0) -> object:
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr[-2000:])
    return json.loads(done.stdout)


def _obj(done: subprocess.CompletedProcess[str], code: int = 0) -> dict[str, object]:
    value = _json(done, code)
    assert isinstance(value, dict), value
    return value


def _utc(value: object) -> datetime:
    assert isinstance(value, str), value
    assert value.endswith("Z"), value
    parsed = datetime.fromisoformat(value)
    assert parsed.utcoffset() == timedelta(0)
    return parsed


def test_every_command_speaks_json(env: dict[str, str]) -> None:
    admin: list[tuple[str, ...]] = [
        ("topics",),
        ("migrate",),
        ("schemas", "check"),
        ("dev", "up"),  # idempotent: the stack is up
        ("dev", "status"),
    ]
    for args in admin:
        assert _json(cli(env, *args, "-o", "json"))
    with worker(env, "tests.agents:gated"):
        started = _obj(
            cli(env, "-o", "json", "start", "research", "--input", '{"topic": "x"}')
        )
        # queued when the worker has not said yet that it serves the agent
        assert started["status"] in ("applied", "queued"), started
        run = str(started["run_id"])
        until(
            lambda: _obj(cli(env, "status", run, "-o", "json"))["status"] == "paused",
            what="the gate",
        )
        shown = _obj(cli(env, "status", run, "-o", "json"))
        # At a gate: the pending call's tool and the arguments an approval approves.
        awaiting = shown["awaiting"]
        assert isinstance(awaiting, dict)
        assert awaiting["tool"] == "create_ticket"
        assert isinstance(awaiting["args"], dict)
        assert awaiting["args"]["title"]
        assert _utc(shown["started_at"]) <= datetime.now(UTC)
        _the_client_types_it(env, run, awaiting)
        assert _obj(cli(env, "approve", run, "--by", "ann", "-o", "json"))[
            "status"
        ] == ("applied")
        until(
            lambda: (
                _obj(cli(env, "status", run, "-o", "json"))["status"] == "completed"
            ),
            what="completion",
        )
        # Refused decisions: exit 1, with the verdict as JSON.
        refusals: list[tuple[str, ...]] = [
            ("reject", run, "--by", "bob"),
            ("provide-input", run, "--by", "bob", "--input", "{}"),
            ("cancel", run, "--by", "bob"),
        ]
        for args in refusals:
            refused = _obj(cli(env, *args, "-o", "json"), code=1)
            assert refused["status"] == "refused", refused
            assert refused["reason"], refused
        forked = _obj(cli(env, "fork", run, "--at", "1", "-o", "json"))
        assert forked["status"] == "applied"
    replayed = _obj(cli(env, "replay", run, "-o", "json"))
    summary = replayed["summary"]
    assert isinstance(summary, dict)
    assert summary["status"] == "completed"
    events = replayed["events"]
    assert isinstance(events, list)
    assert len(events) == summary["events"]
    lines = cli(env, "replay", run, "-o", "jsonl").stdout.splitlines()
    assert [json.loads(line) for line in lines[:-1]] == events
    assert cli(env, "projector", "--until-caught-up").returncode == 0
    _completes(env, run)
    _one_document(env, run, len(events))
    listed = _json(cli(env, "runs", "-o", "json", "--agent", "research"))
    assert isinstance(listed, list)
    assert run in {r["run_id"] for r in listed}
    _times_read_back(env, listed)
    assert _json(cli(env, "runs", "-o", "json", "--agent", "nobody")) == []
    later = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S")
    assert _json(cli(env, "runs", "-o", "json", "--since", later)) == []
    jsonl = cli(env, "runs", "-o", "jsonl", "--limit", "1").stdout.splitlines()
    assert len(jsonl) == 1
    assert json.loads(jsonl[0])["run_id"]
    audit = cli(env, "audit", "-o", "json", "--no-bare", "--run-prefix", run)
    assert audit.returncode == 0, audit.stderr[-2000:]
    assert json.loads(audit.stdout)["runs"] == 1
    assert _json(cli(env, "dlq", "list", "-o", "json", "--run", run)) == []


def _times_read_back(env: dict[str, str], listed: list[dict[str, object]]) -> None:
    """Every time the CLI prints is one it reads: a run's ``updated_at`` as
    ``--since`` finds that run."""
    for row in listed:
        printed = row["updated_at"]
        _utc(printed)
        again = _json(cli(env, "runs", "-o", "json", "--since", str(printed)))
        assert isinstance(again, list)
        assert row["run_id"] in {r["run_id"] for r in again}


def _one_document(env: dict[str, str], run: str, events: int) -> None:
    """``-o json`` is one JSON document on every command; ``-o jsonl`` a line each
    (show's timeline: an array, or an event a line)."""
    timeline = _json(cli(env, "show", run, "-o", "json"))
    assert isinstance(timeline, list)
    assert len(timeline) == events
    lines = cli(env, "show", run, "-o", "jsonl").stdout.splitlines()
    assert [json.loads(line) for line in lines] == timeline


def _completes(env: dict[str, str], run: str) -> None:
    """The shell completes a run id from its first characters (bash, click's)."""
    done = subprocess.run(
        [str(Path(sys.executable).parent / "es-agents")],
        env={
            **_env(**env),
            "_ES_AGENTS_COMPLETE": "bash_complete",
            "COMP_WORDS": f"es-agents status {run[:8]}",
            "COMP_CWORD": "2",
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"plain,{run}" in done.stdout.splitlines(), done.stdout[-2000:]


def _the_client_types_it(env: dict[str, str], run: str, awaiting: object) -> None:
    """The call a run waits at, typed, as ``status -o json`` showed it."""
    assert isinstance(awaiting, dict)
    settings = Settings(kafka=_kafka(env), database_url=env["ES_AGENTS_DATABASE_URL"])
    with Client(settings) as c:
        pending = c.status(run).pending
    assert pending is not None
    assert pending.tool == "create_ticket"
    assert pending.args == awaiting["args"]
    assert pending.gate == "create_ticket"
    assert pending.key is None  # requested once approved
    assert pending.call_id


def test_exit_codes_say_what_happened(env: dict[str, str]) -> None:
    missing = cli(env, "status", "no-such-run")
    assert missing.returncode == 3
    assert missing.stderr.strip() == "not found: unknown run no-such-run"
    for args in (  # every command that takes a run
        ("status", "no-such-run"),
        ("show", "no-such-run"),
        ("wait", "no-such-run", "--timeout", "1"),
        ("approve", "no-such-run", "--by", "ann"),
        ("reject", "no-such-run", "--by", "ann"),
        ("provide-input", "no-such-run", "--by", "ann", "--input", "{}"),
        ("cancel", "no-such-run", "--by", "ann"),
        ("say", "no-such-run", "hello"),
        ("fork", "no-such-run", "--at", "0"),
        ("forget", "no-such-run"),
        ("replay", "no-such-run"),
    ):
        error = _obj(cli(env, *args, "-o", "json"), code=3)
        assert error["kind"] == "not_found", error
        assert "no-such-run" in str(error["error"])
    usage = cli(env, "runs", "--no-such-option")
    assert usage.returncode == 2
    assert "No such option" in usage.stderr
    assert _obj(cli(env, "-o", "json", "runs", "--limit", "0"), code=2)["kind"] == (
        "usage"
    )
    assert cli(env, "-o", "yaml", "runs").returncode == 2


def test_unreachable_services_fail_fast_in_one_line(env: dict[str, str]) -> None:
    port = free_port()
    cases = {
        "Kafka": {"ES_AGENTS_BOOTSTRAP_SERVERS": f"127.0.0.1:{port}"},
        "Postgres": {
            "ES_AGENTS_DATABASE_URL": f"postgresql://postgres@127.0.0.1:{port}/x"
        },
    }
    for service, broken in cases.items():
        down = {**env, **broken, "ES_AGENTS_CONNECT_TIMEOUT": "2"}
        started = time.monotonic()
        done = cli(down, "status", "some-run")
        took = time.monotonic() - started
        assert done.returncode == 4, done.stderr[-2000:]
        assert took < 2 + 8, took  # the timeout, plus a process's start
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, lines  # no client-library noise
        assert lines[0].startswith(f"unavailable: {service} at ")
        assert "es-agents dev up" in lines[0]
        error = _obj(cli(down, "-o", "json", "status", "some-run"), code=4)
        assert error["kind"] == "unavailable"


def test_the_client_waits_lists_and_reads_events(
    env: dict[str, str], kafka_settings: KafkaSettings, database_url: str
) -> None:
    settings = Settings(kafka=kafka_settings, database_url=database_url)
    with Client(settings) as client:
        with pytest.raises(NotFound):
            client.approve("no-such-run", by="ann")
        with pytest.raises(NotFound):
            client.events("no-such-run")
        run = client.start("quick", wait=0).run_id
        with pytest.raises(TimeoutError, match="not completed"):
            client.wait(run, until=("completed",), timeout=0.5)  # no worker yet
        with worker(env, "tests.agents:quick"):
            view = client.wait(run, until=("completed",), timeout=60)
        assert view.status == "completed"
        assert view.state is not None
        events = client.events(run)
        assert [e.seq for e in events] == list(range(view.state.seq + 1))
        assert isinstance(events[0], RunStarted)
        assert cli(env, "projector", "--until-caught-up").returncode == 0
        quick = client.runs(agent="quick", limit=1000)
        assert run in [r.run_id for r in quick]
        assert {r.agent for r in quick} == {"quick"}
        assert all(r.updated_at.tzinfo is not None and r.events > 0 for r in quick)
        failed = client.runs(status="failed", agent="quick", limit=1000)
        assert run not in [r.run_id for r in failed]
        since = datetime.now(UTC) + timedelta(hours=1)
        assert client.runs(agent="quick", since=since) == []


def test_the_async_client_does_the_same_from_an_event_loop(
    env: dict[str, str], kafka_settings: KafkaSettings, database_url: str
) -> None:
    settings = Settings(kafka=kafka_settings, database_url=database_url)

    async def scenario() -> tuple[str, str, int]:
        async with AsyncClient(settings) as client:
            with pytest.raises(NotFound):
                await client.status("no-such-run")
            started = await client.start("research", '{"topic": "async"}', wait=0)
            paused = await client.wait(started.run_id, until=("paused",), timeout=90)
            approved = await client.approve(started.run_id, by="ann", wait=30)
            done = await client.wait(started.run_id, until=("completed",), timeout=90)
            events = await client.events(started.run_id)
            assert paused.state is not None
            assert paused.state.waiting is not None
            assert paused.state.waiting.gate == "create_ticket"
            return approved.status, done.status, len(events)

    with worker(env, "tests.agents:gated"):
        approved, final, count = asyncio.run(scenario())
    assert (approved, final) == ("applied", "completed")
    assert count > 5
