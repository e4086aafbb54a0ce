"""Run budgets on the real stack: a run started with its own limits (`start
--budget`) and the policy pause waits for a person at its limit -- `status` says
why, `approve` grants as much again, `reject` ends it as budget_exceeded."""

from __future__ import annotations

import json

import pytest

from es_agents.lab.demo import cli
from tests.integration.test_commands import until, worker

pytestmark = pytest.mark.integration


def _status(env: dict[str, str], run: str) -> dict[str, object]:
    done = cli(env, "status", run, "-o", "json")
    assert done.returncode == 0, done.stderr[-2000:]
    shown = json.loads(done.stdout)
    assert isinstance(shown, dict)
    return shown


def test_a_run_with_its_own_budget_pauses_for_a_person(env: dict[str, str]) -> None:
    budget = json.dumps({"max_model_calls": 3, "on_exceeded": "pause"})
    bad = cli(env, "start", "longwinded", "--queue", "--budget", '{"max_steps": -1}')
    assert bad.returncode == 1, bad.stderr  # refused before it is sent
    assert "must be positive" in bad.stderr
    with worker(env, "tests.agents:longwinded"):
        started = cli(env, "start", "longwinded", "--budget", budget, "-o", "json")
        assert started.returncode == 0, started.stderr[-2000:]
        run = str(json.loads(started.stdout)["run_id"])

        def at_budget(calls: int) -> bool:
            shown = _status(env, run)
            return shown["status"] == "paused" and shown["model_calls"] == calls

        until(lambda: at_budget(3), 60, "the run paused at its budget")
        shown = _status(env, run)
        assert shown["waiting"] == "budget_exceeded", shown
        assert "3 model calls of at most 3" in json.dumps(shown)
        # A gate's name is not a budget decision.
        wrong = cli(env, "approve", run, "--by", "ops", "--gate", "confirm")
        assert wrong.returncode == 1
        assert "decision on its budget" in wrong.stderr
        assert cli(env, "approve", run, "--by", "ops").returncode == 0
        until(lambda: at_budget(6), 60, "paused again after as much again")
        stopped = cli(env, "reject", run, "--by", "ops", "--reason", "too long")
        assert stopped.returncode == 0, stopped.stderr
        until(lambda: _status(env, run)["status"] == "failed", 60, "failed")
    shown = _status(env, run)
    assert "budget exceeded; ops decided to stop: too long" in str(shown["error"])
