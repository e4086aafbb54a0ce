"""Schedules from the client's side (``Client.schedules``): set, pause, resume,
delete and list them. A change is a ``change_schedule`` command a worker of the
schedule's agent applies (and signs); it is checked here first, so a bad one is
refused before anything is sent."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal, Protocol

from es_agents.client_types import CommandResult, as_json
from es_agents.core.commands import ChangeSchedule, Command
from es_agents.core.schedules import InvalidSchedule, Schedule, key_for
from es_agents.errors import InvalidInput, NotFound
from es_agents.ports import Ports, ScheduleRow


class Sender(Protocol):
    """What the schedules need of ``Client``: its ports, and its checked sends."""

    @property
    def ports(self) -> Ports: ...

    def _plain_to_encrypted(self, agent: str) -> str | None: ...

    def _deliver(self, command: Command, agent: str, wait: float) -> CommandResult: ...


Missed = Literal["skip", "one", "all"]


@dataclass(frozen=True)
class ScheduleView:
    """A schedule as its agent's workers keep it."""

    name: str
    agent: str
    when: str  # "cron */5 * * * *" or "every 60s"
    created_at: datetime  # ticks count from here (intervals); none before it
    missed: Missed
    paused: bool
    next_due: datetime | None  # None while paused
    last_tick: datetime | None
    last_run_id: str | None  # the run the last tick started
    input_json: str


def parse_every(text: str) -> int:
    """``90``, ``90s``, ``15m``, ``2h`` or ``1d`` as whole seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    body, unit = (text[:-1], text[-1]) if text[-1:] in units else (text, "s")
    try:
        n = int(body)
    except ValueError:
        raise InvalidInput(
            f"interval {text!r}: a whole number with s, m, h or d (90s, 15m, 2h)"
        ) from None
    return n * units[unit]


class ScheduleClient:
    def __init__(self, client: Sender) -> None:
        self._client = client

    def set(
        self,
        name: str,
        agent: str,
        input_json: object = "{}",
        *,
        cron: str | None = None,
        every: int | timedelta | str | None = None,
        missed: Missed = "skip",
        by: str = "client",
        wait: float = 10.0,
    ) -> CommandResult:
        """Create or replace schedule ``name``: a run of ``agent`` with this input
        at every tick of ``cron`` (five fields, UTC) or ``every`` (seconds, a
        timedelta, or ``"15m"``). Ticks missed while nothing could fire them:
        ``skip`` them, fire the latest ``one``, or ``all``. Raises
        ``InvalidInput`` for a schedule that cannot be kept (nothing is sent)."""
        seconds = _seconds(every)
        text = as_json(input_json, "the schedule's input")
        try:  # the same checks the worker makes
            Schedule(name, agent, text, missed, datetime.now(UTC), cron, seconds)
        except InvalidSchedule as e:
            raise InvalidInput(str(e)) from None
        command = ChangeSchedule(
            run_id=key_for(name),
            by=by,
            agent=agent,
            name=name,
            action="set",
            input_json=text,
            cron=cron,
            every_seconds=seconds,
            missed=missed,
        )
        plain = self._client._plain_to_encrypted(agent)
        if plain is not None:
            return CommandResult(command, "refused", plain)
        return self._client._deliver(command, agent, wait)

    def pause(self, name: str, by: str = "client", wait: float = 10.0) -> CommandResult:
        return self._change(name, "pause", by, wait)

    def resume(
        self, name: str, by: str = "client", wait: float = 10.0
    ) -> CommandResult:
        """Fire again from the next tick on (the ticks while paused are not fired)."""
        return self._change(name, "resume", by, wait)

    def delete(
        self, name: str, by: str = "client", wait: float = 10.0
    ) -> CommandResult:
        """No more ticks; the runs it started stay."""
        return self._change(name, "delete", by, wait)

    def get(self, name: str) -> ScheduleView:
        schedules = self._client.ports.schedules
        row = None if schedules is None else schedules.get(name)
        if row is None:
            raise NotFound(f"no schedule {name!r}")
        return _view(row)

    def list(self, agent: str | None = None) -> list[ScheduleView]:
        schedules = self._client.ports.schedules
        return [] if schedules is None else [_view(r) for r in schedules.list(agent)]

    def _change(
        self,
        name: str,
        action: Literal["pause", "resume", "delete"],
        by: str,
        wait: float,
    ) -> CommandResult:
        agent = self.get(name).agent
        command = ChangeSchedule(
            run_id=key_for(name), by=by, agent=agent, name=name, action=action
        )
        return self._client._deliver(command, agent, wait)


def _seconds(every: int | timedelta | str | None) -> int | None:
    if every is None or isinstance(every, int):
        return every
    if isinstance(every, timedelta):
        return int(every.total_seconds())
    return parse_every(every)


def _view(row: ScheduleRow) -> ScheduleView:
    s = row.schedule
    return ScheduleView(
        name=s.name,
        agent=s.agent,
        when=s.when,
        created_at=s.created_at,
        missed=s.missed,
        paused=s.paused,
        next_due=None if s.paused else row.next_due,
        last_tick=row.last_tick,
        last_run_id=row.last_run_id,
        input_json=s.input_json,
    )
