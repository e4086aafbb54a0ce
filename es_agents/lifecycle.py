"""A run's lifecycle in the worker's log: one line per event of interest, written
once the event is acknowledged -- started, paused (with the reason), resumed,
completed, failed, reconciled, migrated, forked, and at DEBUG each step's
intention -- with ``run_id``, ``step``, ``agent`` and ``event`` as fields
(``es_agents.log_format`` makes them JSON keys). Logger ``es_agents.runs``;
silence it with its level."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from es_agents.core.events import (
    Event,
    Forked,
    Interrupted,
    Migrated,
    ModelCallRequested,
    Resumed,
    RunCompleted,
    RunFailed,
    RunStarted,
    ToolCallRequested,
    ToolReturned,
)

log = logging.getLogger("es_agents.runs")


def _line(event: Event) -> tuple[str, dict[str, object]] | None:  # noqa: PLR0911
    """The message and fields of an event of interest (None: not one)."""
    if isinstance(event, RunStarted):
        return "run started", {}
    if isinstance(event, ModelCallRequested):
        return "step: model call", {"attempt": event.attempt}
    if isinstance(event, ToolCallRequested):
        return f"step: tool {event.tool}", {"tool": event.tool}
    if isinstance(event, Interrupted):
        return f"paused: {event.reason}", {"reason": event.reason}
    if isinstance(event, Resumed):
        return f"resumed: {event.reason}", {"reason": event.reason, "by": event.by}
    if isinstance(event, RunCompleted):
        return "completed", {}
    if isinstance(event, RunFailed):
        return f"failed: {event.kind}", {"kind": event.kind, "error": event.error}
    if isinstance(event, ToolReturned) and event.reconciled:
        return "reconciled a tool call", {"call_id": event.call_id}
    if isinstance(event, Migrated):
        return "migrated", {}
    if isinstance(event, Forked):
        return "forked", {"origin_run": event.origin_run}
    return None


def acknowledged(agent: str, events: Sequence[Event]) -> None:
    """Log the events of interest among an acknowledged batch: changes of a
    run's course at INFO, each step's intention at DEBUG (a line per step was a
    tenth of a busy worker's CPU)."""
    if not log.isEnabledFor(logging.INFO):
        return
    steps = log.isEnabledFor(logging.DEBUG)
    for event in events:
        step = isinstance(event, ModelCallRequested | ToolCallRequested)
        if step and not steps:
            continue
        line = _line(event)
        if line is not None:
            message, fields = line
            log.log(
                logging.DEBUG if step else logging.INFO,
                "run %s: %s",
                event.run_id,
                message,
                extra={
                    "run_id": event.run_id,
                    "step": event.step,
                    "agent": agent,
                    "event": event.wire_name,
                    **fields,
                },
            )
