"""The pytest plugin users test their agents with: the tutorial's example runs as a
user's test file would (a pytest process of its own, the plugin found by its entry
point), and the virtual clock wakes a sleeping run."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from es_agents.adapters.memory_log import MemorySource
from es_agents.core.state import RunState
from es_agents.core.step import Finish, Interrupt, Step
from es_agents.runtime.worker import Worker
from es_agents.testing import AgentHarness, VirtualClock
from tests.doc_blocks import DOCS, blocks


def test_the_tutorials_example_passes_as_a_users_test_file(tmp_path: Path) -> None:
    page = DOCS / "tutorials" / "testing.md"
    example = next(b for b in blocks(page) if b.file == "test_my_agent.py")
    (tmp_path / "test_my_agent.py").write_text(example.code)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "."],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "2 passed" in done.stdout


class Napper:
    """Sleeps an hour after starting, then finishes."""

    name = "napper"
    tools: dict[str, Any] = {}  # noqa: RUF012 - read-only
    model = None

    def plan(self, state: RunState) -> Step:
        if state.last_resume is not None:
            return Finish({"woke": state.last_resume.reason})
        assert state.started_at is not None
        return Interrupt("sleeping", wake_at=state.started_at + timedelta(hours=1))

    def versions(self) -> dict[str, str | int]:
        return {"agent_version": "napper@1"}


def test_the_virtual_clock_wakes_a_sleeping_run(
    es_harness: Callable[[Any], AgentHarness], virtual_clock: VirtualClock
) -> None:
    h = es_harness(Napper())
    run = h.start()
    h.run()
    assert h.state(run).status == "paused"
    virtual_clock.advance(59 * 60)
    h.run()
    assert h.state(run).status == "paused"  # not yet
    virtual_clock.advance(2 * 60)
    h.run()
    assert h.state(run).status == "completed"
    assert h.timeline(run)[-2:] == ["resumed", "run_completed"]


def test_a_timer_fired_as_the_worker_would_go_idle_is_served(
    es_harness: Callable[[Any], AgentHarness],
    virtual_clock: VirtualClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A machine so busy that a poll and the timers' firing take longer than the
    # worker's idle time (and its start-up recoveries are done meanwhile): the
    # timer's command, fired after a poll found nothing, must still be read before
    # the worker calls itself idle.
    h = es_harness(Napper())
    run = h.start()
    h.run()
    virtual_clock.advance(61 * 60)
    polled, fire = MemorySource.poll, Worker._fire_timers

    def slow_poll(self: MemorySource[Any], timeout: float) -> Any:
        time.sleep(0.1)
        return polled(self, timeout)

    def slow_fire(self: Worker) -> int:
        time.sleep(0.1)
        return fire(self)

    monkeypatch.setattr(MemorySource, "poll", slow_poll)
    monkeypatch.setattr(Worker, "_fire_timers", slow_fire)
    h.run()
    assert h.state(run).status == "completed"


def test_crash_at_fails_a_test_whose_worker_never_gets_there(
    es_harness: Callable[[Any], AgentHarness],
    crash_at: Callable[[AgentHarness, str], None],
) -> None:
    h = es_harness(Napper())
    h.start()
    crash_at(h, "before_append:interrupted")  # the napper pauses: it gets there
    with pytest.raises(pytest.fail.Exception, match="never reached"):
        crash_at(h, "after_action:tool")  # it has no tool
