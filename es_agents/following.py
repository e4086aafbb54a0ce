"""Following a run's streamed answers (``Client.stream``): from the call in flight
when the follower attaches -- what was sent of it so far first -- until the run
stops working (it waits, or ended)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

from es_agents.client_types import RunView
from es_agents.core.state import PendingModelCall
from es_agents.errors import NotFound
from es_agents.ports import Delta, Deltas

# A stream starts this long before the run's last event (clocks differ a little).
STREAM_LOOKBACK = timedelta(seconds=5)
# After the run stopped working, deltas still on their way are read this long.
STREAM_DRAIN_SECONDS = 0.3
# A run nobody knows of is followed this long (its start may be on its way).
STREAM_UNKNOWN_SECONDS = 10.0


def follow_run(
    deltas: Deltas,
    status: Callable[[str], RunView],
    run_id: str,
    timeout: float | None = None,
    cancel: threading.Event | None = None,
) -> Iterator[Delta]:
    """The run's deltas from its call in flight (or its next call) on, until it
    stops working, ``timeout`` seconds passed or ``cancel`` is set."""
    try:
        state = status(run_id).state
    except NotFound:  # a start not seen yet: followed for a while
        state = None
    since = datetime.now(UTC) - STREAM_LOOKBACK
    floor = (0, 0)
    if state is not None:
        if state.updated_at is not None:
            since = min(since, state.updated_at - STREAM_LOOKBACK)
        pending = state.pending
        floor = (
            (pending.step, pending.attempt)
            if isinstance(pending, PendingModelCall)
            else (state.step + 1, 0)
        )
    deadline = None if timeout is None else time.monotonic() + timeout
    unknown_until = time.monotonic() + STREAM_UNKNOWN_SECONDS
    idle_since: list[float] = []

    def stop() -> bool:
        if deadline is not None and time.monotonic() > deadline:
            return True
        if cancel is not None and cancel.is_set():
            return True
        try:
            now = status(run_id).status
        except NotFound:  # no such run, or its start is not seen yet
            now = "pending" if time.monotonic() < unknown_until else "unknown"
        if now in ("running", "pending"):
            idle_since.clear()
            return False
        idle_since.append(time.monotonic())  # stopped: one more look first
        return idle_since[-1] - idle_since[0] >= STREAM_DRAIN_SECONDS

    for delta in deltas.follow(run_id, since, stop):
        if (delta.step, delta.attempt) >= floor:
            yield delta
