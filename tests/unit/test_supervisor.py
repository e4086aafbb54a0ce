"""The supervisor behind `es-agents serve`: a child that exits is started again
with a growing backoff and one line for its outage; a configuration error stops
everything with its code; stopping ends the children."""

from __future__ import annotations

import logging
import sys
import threading
import time

import pytest

from es_agents.supervisor import Child, Supervisor


def _child(name: str, code: int, after: float = 0.0) -> Child:
    script = f"import sys, time; time.sleep({after}); sys.exit({code})"
    return Child(name, [sys.executable, "-c", script])


def test_a_child_that_exits_is_started_again_with_one_line_for_the_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    flaky = _child("worker", 4)
    supervisor = Supervisor([flaky], first_backoff=0.05)
    caplog.set_level(logging.INFO, logger="es_agents.supervisor")
    runner = threading.Thread(target=supervisor.run)
    runner.start()
    deadline = time.monotonic() + 30
    while flaky.restarts < 3:
        assert time.monotonic() < deadline, flaky.exits
        time.sleep(0.05)
    supervisor.stop()
    runner.join(30)
    assert not runner.is_alive()
    assert supervisor.exit_code == 0
    assert flaky.exits[:3] == [4, 4, 4]
    assert flaky.backoff > 0.05 * 4  # it grew
    downs = [r for r in caplog.records if "down (exit 4" in r.getMessage()]
    assert len(downs) == 1  # one line for the outage, not one per try


def test_a_configuration_error_stops_everything_with_its_code() -> None:
    steady = _child("projector", 0, after=60)
    broken = _child("worker", 2)
    supervisor = Supervisor([steady, broken], first_backoff=0.05)
    started = time.monotonic()
    assert supervisor.run() == 2
    assert time.monotonic() - started < 30
    assert broken.exits == [2]
    assert steady.process is not None
    assert steady.process.poll() is not None  # stopped with it
