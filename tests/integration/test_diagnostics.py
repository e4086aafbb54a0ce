"""What the CLI says when something is wrong or someone asks what is served: a
database that does not exist is named with how to create it, a refused connection
fails at once, and `es-agents agents` lists the served agents with their workers."""

from __future__ import annotations

import json
import time

import pytest

from es_agents.lab.demo import cli
from tests.integration.test_commands import until, worker

pytestmark = pytest.mark.integration


def test_a_missing_database_is_named_with_how_to_create_it(
    env: dict[str, str],
) -> None:
    host = env["ES_AGENTS_DATABASE_URL"].rsplit("/", 1)[0]
    answer = cli({**env, "ES_AGENTS_DATABASE_URL": f"{host}/no_such_db_here"}, "runs")
    assert answer.returncode == 2, answer.stderr  # configuration, not an outage
    assert "'no_such_db_here' does not exist" in answer.stderr
    assert 'CREATE DATABASE "no_such_db_here"' in answer.stderr


def test_a_refused_connection_fails_at_once(env: dict[str, str]) -> None:
    # With a 30 s connect timeout, only a connection that is refused (port 1: no
    # server) and said so at once returns well within it.
    wrong = {
        **env,
        "ES_AGENTS_DATABASE_URL": "postgresql://postgres@127.0.0.1:1/x",
        "ES_AGENTS_CONNECT_TIMEOUT": "30",
    }
    started = time.monotonic()
    answer = cli(wrong, "runs")
    took = time.monotonic() - started
    assert answer.returncode == 4, answer.stderr
    assert "Connection refused" in answer.stderr
    assert took < 15, f"{took:.1f} s: waited for the timeout"


def test_agents_lists_the_served_agents_and_their_workers(
    env: dict[str, str],
) -> None:
    empty = cli(env, "agents")
    assert empty.returncode == 0, empty.stderr
    assert "no agent is served" in empty.stdout

    def served() -> list[dict[str, object]]:
        shown = cli(env, "agents", "-o", "json")
        assert shown.returncode == 0, shown.stderr
        rows = json.loads(shown.stdout)
        assert isinstance(rows, list)
        return rows

    with worker(env, "tests.agents:gated"):
        until(lambda: any(r["live_workers"] == 1 for r in served()), what="served")
        (row,) = served()
        assert row["agent"] == "research"
        assert "create_ticket" in str(row["tools"])
        text = cli(env, "agents").stdout
        assert "research" in text
        assert "1/1" in text
    (row,) = served()  # the worker said it stopped
    assert row["live_workers"] == 0
    workers = row["workers"]
    assert isinstance(workers, list)
    assert [w["stopped"] for w in workers] == [True]
