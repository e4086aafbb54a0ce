"""Workers and the projector serve Prometheus metrics, scraped over HTTP while the
research agent goes through its gate; the worker logs the run's lifecycle as JSON
lines (its stderr is not a terminal)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
from prometheus_client.parser import text_string_to_metric_families

from es_agents.lab.demo import _env, cli
from tests.integration.test_commands import until
from tests.test_support import ROOT, free_port

pytestmark = pytest.mark.integration


@dataclass
class _Served:
    port: int
    log: str = ""


@contextmanager
def _serving(env: dict[str, str], *args: str) -> Iterator[_Served]:
    served = _Served(free_port())
    port = served.port
    proc = subprocess.Popen(
        [sys.executable, "-m", "es_agents.cli", *args, "--metrics-port", str(port)],
        cwd=ROOT,
        env=_env(**env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield served
    finally:
        proc.terminate()
        _, served.log = proc.communicate(timeout=60)
        assert proc.returncode == 0, served.log[-3000:]


def _scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    url = f"http://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _value(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float],
    name: str,
    **labels: str,
) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def _answers(port: int) -> bool:
    try:
        _scrape(port)
    except OSError:
        return False
    return True


def test_metrics_and_json_logs(env: dict[str, str]) -> None:
    with (
        _serving(env, "worker", "--agent", "tests.agents:gated") as served,
        _serving(env, "projector") as projected,
    ):
        worker, projector = served.port, projected.port
        until(lambda: _answers(worker) and _answers(projector), what="/metrics")
        run = cli(env, "start", "research", "--input", '{"topic": "m"}').stdout.strip()
        until(lambda: "paused" in cli(env, "status", run).stdout, what="the gate")
        assert cli(env, "approve", run, "--by", "ann").returncode == 0
        until(lambda: "completed" in cli(env, "status", run).stdout, what="the end")
        w = _scrape(worker)
        assert _value(w, "es_agents_steps_total", agent="research", kind="model") >= 2
        assert _value(w, "es_agents_steps_total", agent="research", kind="tool") >= 1
        assert _value(w, "es_agents_steps_total", agent="research", kind="finish") == 1
        assert _value(w, "es_agents_append_seconds_count", agent="research") >= 4
        assert _value(w, "es_agents_step_seconds_count", agent="research") >= 4
        model = "scripted-research"
        assert (
            _value(
                w,
                "es_agents_model_call_seconds_count",
                agent="research",
                model=model,
                outcome="ok",
            )
            >= 2
        )
        assert _value(w, "es_agents_fenced_appends_total", agent="research") == 0
        until(
            lambda: (
                _value(_scrape(projector), "es_agents_runs", status="completed") >= 1
            ),
            what="runs by status",
        )
        p = _scrape(projector)
        assert _value(p, "es_agents_events_projected_total", type="run_completed") >= 1
        assert _value(p, "es_agents_approval_wait_seconds_count", agent="research") == 1
        assert _value(p, "es_agents_projector_lag_seconds") >= 0
    lines = [
        json.loads(line) for line in served.log.splitlines() if line.startswith("{")
    ]
    assert all({"ts", "level", "logger", "msg"} <= set(line) for line in lines)
    mine = [line for line in lines if line.get("run_id") == run]
    assert all(line["agent"] == "research" for line in mine)
    events = [line["event"] for line in mine]
    assert events[0] == "run_started"
    assert events[-1] == "run_completed"
    paused = next(line for line in mine if line["event"] == "interrupted")
    assert paused["reason"] == "awaiting_approval"
    resumed = next(line for line in mine if line["event"] == "resumed")
    assert resumed["by"] == "ann"
    # Each step's intention is a DEBUG line: not at the worker's default level.
    assert not {"model_call_requested", "tool_call_requested"} & set(events)
    assert all(isinstance(line["step"], int) for line in mine)
