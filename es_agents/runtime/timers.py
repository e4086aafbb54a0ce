"""Firing due timers, as every worker does in its loop.

Due timers are claimed in batches (for 30 s, under ``FOR UPDATE SKIP LOCKED`` on
Postgres, so workers share the work), their ``fire_timer`` commands are produced
together and acknowledged together, and only then are the timers marked fired. A
crash in between fires them again once the claim has run out; a run ignores a timer
that does not wake it.
"""

from __future__ import annotations

from collections.abc import Sequence

from es_agents.core.commands import FireTimer
from es_agents.ports import Due, EventLog, Timers

BATCH = 1000


def fire_timers(timers: Timers, log: EventLog, batch: int = BATCH) -> int:
    """Fire up to ``batch`` due timers; the number fired (``batch``: call again)."""

    def fire(due: Sequence[Due]) -> None:
        log.send_all(
            [
                FireTimer(run_id=run_id, timer_id=timer_id, due_at=due_at)
                for timer_id, run_id, due_at in due
            ]
        )

    return timers.fire_due(fire, limit=batch)
