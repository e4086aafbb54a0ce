"""`show RUN [--follow]` tells a run's timeline and follows it to its end; `events
tail` prints events as they are appended."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest

from es_agents.lab.demo import _env, cli
from tests.integration.test_commands import until, worker
from tests.test_support import ROOT

pytestmark = pytest.mark.integration


def _popen(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "es_agents.cli", *args],
        cwd=ROOT,
        env=_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_show_follows_a_run_and_tail_prints_its_events(env: dict[str, str]) -> None:
    run = f"show-{uuid.uuid4().hex[:8]}"
    tail = _popen(
        env, "events", "tail", "--run", run, "-o", "jsonl", "--max-events", "4"
    )
    with worker(env, "tests.agents:gated"):
        started = cli(
            env, "start", "research", "--run-id", run, "--input", '{"topic": "s"}'
        )
        assert started.returncode == 0, started.stderr
        until(lambda: "paused" in cli(env, "status", run).stdout, what="the gate")
        shown = cli(env, "show", run)
        assert shown.returncode == 0, shown.stderr
        for word in (
            "run_started",
            "model_call_requested",
            "create_ticket",
            "interrupted",
        ):
            assert word in shown.stdout, (word, shown.stdout)
        assert "status: paused" in shown.stderr
        follow = _popen(env, "show", run, "--follow", "--every", "0.2", "-o", "jsonl")
        assert cli(env, "approve", run, "--by", "ann").returncode == 0
        out, err = follow.communicate(timeout=60)  # ends with the run
        assert follow.returncode == 0, err
    entries = [json.loads(line) for line in out.splitlines()]
    assert [e["seq"] for e in entries] == list(range(len(entries)))
    assert entries[-1]["type"] == "run_completed"
    resumed = next(e for e in entries if e["type"] == "resumed")
    assert resumed["by"] == "ann"
    responded = [e for e in entries if e["type"] == "model_responded"]
    assert responded
    assert all(e["latency_ms"] is not None for e in responded)
    tailed_out, tailed_err = tail.communicate(timeout=60)
    assert tail.returncode == 0, tailed_err
    tailed = [json.loads(line) for line in tailed_out.splitlines()]
    assert [e["seq"] for e in tailed] == [0, 1, 2, 3]
    assert {e["run_id"] for e in tailed} == {run}
    assert tailed[0]["type"] == "run_started"
