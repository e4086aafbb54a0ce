"""``show --follow`` against a client whose run ends between two of its reads."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner

from es_agents.cli import commands
from es_agents.cli.base import cli
from es_agents.core.events import Event, RunCompleted, RunStarted, StatePatched


class _EndsBetweenReads:
    """The run's events are read, then it completes before its status is read:
    the status says completed while the events read lacks the last one."""

    def __init__(self) -> None:
        run = "r1"
        self.log: list[Event] = [
            RunStarted(
                run_id=run, seq=0, step=0, agent="a", input_json="{}", command_id="c"
            ),
            StatePatched(run_id=run, seq=1, step=0, key="k", value_json="1"),
        ]
        self.last = RunCompleted(run_id=run, seq=2, step=0, output_json="{}")
        self.settings = SimpleNamespace(prices={})
        self.ports = SimpleNamespace(deltas=None)  # a store that does not stream

    def __enter__(self) -> _EndsBetweenReads:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def events(self, run_id: str) -> list[Event]:
        return list(self.log)

    def status(self, run_id: str) -> Any:
        if self.last not in self.log:
            self.log.append(self.last)  # it ended just now
        return SimpleNamespace(status="completed")


def test_follow_prints_the_events_of_a_run_that_ended_between_two_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(commands, "client", _EndsBetweenReads)
    result = CliRunner().invoke(cli, ["show", "r1", "--follow", "-o", "jsonl"])
    assert result.exit_code == 0, result.output
    types = [json.loads(line)["type"] for line in result.stdout.splitlines()]
    assert types == ["run_started", "state_patched", "run_completed"]
