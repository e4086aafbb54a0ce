"""`es-agents serve` on the real stack: one process keeps a worker and a projector
running; the runs list fills without a projector started by hand, a killed worker
comes back and the run goes on; a configuration error stops it with exit 2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from es_agents.lab.demo import _env, cli
from tests.integration.test_commands import until
from tests.test_support import ROOT

pytestmark = pytest.mark.integration


def _children(pid: int) -> list[int]:
    found = subprocess.run(
        ["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False
    )
    return [int(p) for p in found.stdout.split()]


def _worker_pid(pid: int) -> int | None:
    for child in _children(pid):
        try:
            with open(f"/proc/{child}/cmdline", "rb") as f:
                if b"worker" in f.read():
                    return child
        except OSError:
            continue
    return None


def test_serve_keeps_a_worker_and_a_projector_running(env: dict[str, str]) -> None:
    serve = subprocess.Popen(
        [sys.executable, "-m", "es_agents.cli", "serve", "--agent",
         "tests.agents:gated", "--instance-id", f"serve-{uuid.uuid4().hex[:6]}"],
        cwd=ROOT, env=_env(**env), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        started = cli(env, "start", "research", "--input", '{"topic": "serve"}')
        assert started.returncode == 0, started.stderr
        run = started.stdout.strip()

        def listed(status: str) -> bool:
            shown = cli(env, "runs", "-o", "json").stdout  # as projected
            return any(
                r["run_id"] == run and r["status"] == status for r in json.loads(shown)
            )

        until(lambda: listed("paused"), what="the run projected, paused")
        first = _worker_pid(serve.pid)
        assert first is not None
        os.kill(first, signal.SIGKILL)  # a worker dies
        until(lambda: _worker_pid(serve.pid) not in (None, first), what="a new worker")
        approved = cli(env, "approve", run, "--by", "ann", "--wait", "60")
        assert approved.returncode == 0, approved.stderr
        until(lambda: listed("completed"), what="the run completed, projected")
    finally:
        serve.send_signal(signal.SIGTERM)
        _, err = serve.communicate(timeout=90)
    assert serve.returncode == 0, err[-3000:]
    assert "worker down (exit -9)" in err
    assert "worker up again" in err or "worker started" in err


def test_serve_stops_on_a_configuration_error(env: dict[str, str]) -> None:
    began = time.monotonic()
    serve = subprocess.run(
        [sys.executable, "-m", "es_agents.cli", "serve", "--agent", "no_such:agent"],
        cwd=ROOT, env=_env(**env), capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    assert serve.returncode == 2, serve.stderr[-3000:]
    assert "configuration error" in serve.stderr
    assert time.monotonic() - began < 60


def test_an_application_serves_its_agent_from_its_own_process(
    env: dict[str, str], database_url: str
) -> None:
    """``es_agents.serve``: the worker and the projector on threads of the
    application; a run completes and is projected; leaving the block stops both."""
    from es_agents import Client, serve  # noqa: PLC0415
    from es_agents.settings import Settings  # noqa: PLC0415
    from tests.agents import quick  # noqa: PLC0415
    from tests.integration.test_commands import _kafka  # noqa: PLC0415

    settings = Settings(kafka=_kafka(env), database_url=database_url)
    with serve(quick, settings) as serving, Client(settings) as client:
        until(
            lambda: {s.state for s in serving.states.values()} == {"up"},
            60,
            "the worker and the projector up",
        )
        run = client.start("quick", wait=30)
        assert run.status == "applied", run.reason
        assert client.wait(run.run_id, until=("completed",), timeout=60)
        until(
            lambda: any(
                r.run_id == run.run_id and r.status == "completed"
                for r in client.runs(agent="quick")
            ),
            60,
            "the run projected",
        )
    assert {s.state for s in serving.states.values()} == {"stopped"}
    assert not serving.running
