"""Schedules: runs started on a cron expression or an interval, once per tick.

A schedule names an agent, an input and when: a cron expression (five fields,
evaluated in UTC, parsed by ``cronsim``) or an interval in whole seconds (ticks at
``created_at + k * every``). The run a tick starts has an id derived from the
schedule and the tick (``run_id_for``) and so does its ``start_run`` command
(``command_id_for``): firing the same tick twice -- two workers, a crash between
the send and the bookkeeping, a broker outage -- starts it once.

Ticks that passed while nothing could fire them (every worker down, the log out
of reach) are *missed*; the schedule's policy says what becomes of them when
firing is possible again (``due``):

* ``skip``: none of the missed ticks; the latest fires only if it is still on
  time: no later after it than half a period (at least two seconds, at most a
  minute);
* ``one``: the latest tick, however late (one catch-up);
* ``all``: every one of them, oldest first, at most ``CATCH_UP`` per pass.

Nothing here reads a clock: ``now`` is given (the store's clock).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Literal

from cronsim import CronSim, CronSimError

Missed = Literal["skip", "one", "all"]
MISSED: tuple[Missed, ...] = ("skip", "one", "all")
CATCH_UP = 100  # ticks fired for one schedule per pass with ``all``
GRACE = timedelta(minutes=1)  # the most a tick may be late and still be on time
LEAST_GRACE = timedelta(seconds=2)
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
MIN_EVERY = 1
MAX_EVERY = 366 * 24 * 3600


class InvalidSchedule(ValueError):
    """A schedule that cannot be kept, with the reason."""


@dataclass(frozen=True)
class Schedule:
    name: str
    agent: str
    input_json: str
    missed: Missed
    created_at: datetime  # no tick before it is ever fired
    cron: str | None = None
    every_seconds: int | None = None
    paused: bool = False

    def __post_init__(self) -> None:
        why = invalid(self)
        if why is not None:
            raise InvalidSchedule(why)

    @property
    def when(self) -> str:
        return f"cron {self.cron}" if self.cron else f"every {self.every_seconds}s"

    def paused_as(self, paused: bool) -> Schedule:
        return replace(self, paused=paused)


def invalid(s: Schedule) -> str | None:  # noqa: PLR0911 - a check per part
    """Why ``s`` is not a schedule (None: it is)."""
    if not NAME.match(s.name):
        return (
            f"schedule name {s.name!r}: 1-100 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    if not s.agent:
        return "a schedule needs an agent"
    if (s.cron is None) == (s.every_seconds is None):
        return "a schedule needs either a cron expression or an interval, not both"
    if s.cron is not None:
        try:
            CronSim(s.cron, datetime(2000, 1, 1, tzinfo=UTC))
        except CronSimError as e:
            return f"cron expression {s.cron!r}: {e}"
    if s.every_seconds is not None and not MIN_EVERY <= s.every_seconds <= MAX_EVERY:
        return f"interval {s.every_seconds}s: from {MIN_EVERY}s to {MAX_EVERY}s"
    if s.missed not in MISSED:
        return f"missed-tick policy {s.missed!r}: one of {', '.join(MISSED)}"
    if s.created_at.tzinfo is None:
        return "created_at without a time zone"
    try:
        json.loads(s.input_json)
    except ValueError as e:
        return f"the schedule's input is not JSON: {e}"
    return None


def next_tick(s: Schedule, after: datetime) -> datetime:
    """The first tick strictly after ``after`` (and never before ``created_at``)."""
    after = max(after, s.created_at - timedelta(microseconds=1))
    if s.cron is not None:
        return next(CronSim(s.cron, after.astimezone(UTC)))
    every = _every(s)
    k = (after - s.created_at) // every + 1
    return s.created_at + k * every


def latest_tick(s: Schedule, now: datetime) -> datetime | None:
    """The last tick at or before ``now`` (None: none since ``created_at``)."""
    if s.cron is not None:
        tick = next(
            CronSim(
                s.cron, now.astimezone(UTC) + timedelta(microseconds=1), reverse=True
            )
        )
    else:
        every = _every(s)
        tick = s.created_at + ((now - s.created_at) // every) * every
    return tick if tick >= s.created_at else None


def _every(s: Schedule) -> timedelta:
    if s.every_seconds is None:
        raise InvalidSchedule(f"schedule {s.name}: neither cron nor interval")
    return timedelta(seconds=s.every_seconds)


def due(
    s: Schedule, next_due: datetime, now: datetime
) -> tuple[list[datetime], datetime]:
    """The ticks to fire at ``now`` for a schedule whose first unfired tick is
    ``next_due``, and its first unfired tick afterwards."""
    if s.paused or next_due > now:
        return [], next_due
    if s.missed == "all":
        ticks = [next_due]
        while len(ticks) < CATCH_UP:
            following = next_tick(s, ticks[-1])
            if following > now:
                break
            ticks.append(following)
        return ticks, next_tick(s, ticks[-1])
    latest = latest_tick(s, now)
    if latest is None or latest < next_due:  # cannot be: next_due <= now
        return [], next_tick(s, now)
    after = next_tick(s, latest)
    on_time = now - latest <= min(GRACE, max((after - latest) / 2, LEAST_GRACE))
    if s.missed == "one" or on_time:
        return [latest], after
    return [], after  # skip: late, and so missed


def first_due(s: Schedule, now: datetime) -> datetime:
    """The first tick of a schedule set at ``now``."""
    return next_tick(s, now)


def run_id_for(name: str, tick: datetime) -> str:
    """The id of the run ``tick`` starts: the same for every worker and every try."""
    return f"{name}-{tick.astimezone(UTC):%Y%m%dT%H%M%SZ}"


def command_id_for(name: str, tick: datetime) -> str:
    return f"schedule:{name}:{tick.astimezone(UTC).isoformat()}"


def key_for(name: str) -> str:
    """The key a schedule's commands travel under (their ``run_id``)."""
    return f"schedule:{name}"


def signed_bytes(prefix: str, s: Schedule) -> bytes:
    """What a schedule row's MAC covers: everything that decides what it starts,
    and whether (``paused``) and from when (``created_at``)."""
    body = [
        prefix,
        s.name,
        s.agent,
        s.input_json,
        s.missed,
        s.created_at.astimezone(UTC).isoformat(),
        s.cron,
        s.every_seconds,
        s.paused,
    ]
    digest = hashlib.sha256(json.dumps(body, separators=(",", ":")).encode())
    return b"schedule:" + digest.hexdigest().encode()
