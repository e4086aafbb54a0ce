"""The worker's lifecycle lines: a run's changes of course at INFO, each step's
intention only at DEBUG."""

from __future__ import annotations

import logging

import pytest

from es_agents.core.events import RunCompleted, ToolCallRequested
from es_agents.lifecycle import acknowledged

EVENTS = [
    ToolCallRequested(
        run_id="r1",
        seq=1,
        step=1,
        call_id="c1",
        tool="noop",
        args_json="{}",
        idempotency_key="r1:1",
    ),
    RunCompleted(run_id="r1", seq=2, step=1, output_json="null"),
]


@pytest.mark.parametrize(
    ("level", "expected"),
    [
        (logging.INFO, ["run_completed"]),
        (logging.DEBUG, ["tool_call_requested", "run_completed"]),
        (logging.WARNING, []),
    ],
)
def test_step_lines_only_at_debug(
    caplog: pytest.LogCaptureFixture, level: int, expected: list[str]
) -> None:
    caplog.set_level(level, logger="es_agents.runs")
    acknowledged("bench", EVENTS)
    assert [r.event for r in caplog.records] == expected  # type: ignore[attr-defined]
