"""Schedules at work in every worker: applying their changes, firing their ticks.

A ``change_schedule`` command is applied by the worker of its agent that reads it
(its key, ``schedule:<name>``, puts a schedule's changes on one partition, in
order). The worker signs the row it writes with the writer key, over everything
that decides what the schedule starts (``core.schedules.signed_bytes``).

Every worker of the agent fires due schedules in its loop, as it fires timers:
due rows are taken under a row lock, each one's ticks are decided by its
missed-tick policy (``core.schedules.due``), their ``start_run`` commands --
run and command ids derived from the schedule and the tick -- are sent and
acknowledged together, and only then is ``next_due`` moved on, in the same
transaction. A crash, a fenced worker or a broker outage in between sends the
same ticks again, which start nothing new. A row whose MAC does not verify is
never fired: a row written in Postgres by anyone but a worker starts no run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime

from es_agents.core.authorship import AUTH_HEADER, Authenticator, mac_of
from es_agents.core.commands import ChangeSchedule, StartRun
from es_agents.core.schedules import (
    InvalidSchedule,
    Schedule,
    command_id_for,
    due,
    first_due,
    run_id_for,
    signed_bytes,
)
from es_agents.ports import EventLog, Moved, Ports, ScheduleRow, Schedules

log = logging.getLogger(__name__)

ACTIONS = ("set", "pause", "resume", "delete")


def sign(auth: Authenticator | None, prefix: str, s: Schedule) -> str | None:
    return None if auth is None else mac_of(auth.header(signed_bytes(prefix, s)))


def verifies(auth: Authenticator | None, prefix: str, row: ScheduleRow) -> bool:
    if auth is None or row.mac is None:
        return False
    header = [(AUTH_HEADER, row.mac.encode())]
    return auth.verifies(header, signed_bytes(prefix, row.schedule))


def schedule_of(command: ChangeSchedule, now: datetime) -> Schedule:
    """The schedule a ``set`` defines (raises ``InvalidSchedule``); its ticks count
    from ``now``, when it is applied, to the second."""
    return Schedule(
        name=command.name,
        agent=command.agent,
        input_json=command.input_json,
        missed=command.missed,  # type: ignore[arg-type] # checked by Schedule
        created_at=now.astimezone(UTC).replace(microsecond=0),
        cron=command.cron,
        every_seconds=command.every_seconds,
    )


def apply_change(  # noqa: PLR0911 - a verdict per case
    schedules: Schedules,
    auth: Authenticator | None,
    prefix: str,
    command: ChangeSchedule,
    now: datetime,
) -> str | None:
    """Apply ``command``: None, or why it is refused (nothing changed then)."""
    if auth is None:
        return "this worker holds no writer key: it cannot sign a schedule"
    if command.action not in ACTIONS:
        return f"action {command.action!r}: one of {', '.join(ACTIONS)}"
    found = schedules.get(command.name)
    if found is not None and found.schedule.agent != command.agent:
        return (
            f"schedule {command.name!r} belongs to agent "
            f"{found.schedule.agent!r}; delete it first"
        )
    if command.action == "set":
        try:
            s = schedule_of(command, now)
        except InvalidSchedule as e:
            return str(e)
        schedules.put(ScheduleRow(s, first_due(s, now), sign(auth, prefix, s)))
        return None
    if found is None:
        return f"no schedule {command.name!r}"
    if command.action == "delete":
        schedules.delete(command.name)
        return None
    paused = command.action == "pause"
    s = found.schedule.paused_as(paused)
    # Resumed: from the next tick on (the ticks while paused are not "missed").
    next_due = found.next_due if paused else first_due(s, now)
    schedules.put(ScheduleRow(s, next_due, sign(auth, prefix, s)))
    return None


def fire_schedules(
    schedules: Schedules,
    log_: EventLog,
    *,
    agent: str,
    auth: Authenticator | None,
    prefix: str,
    limit: int = 100,
    after_send: Callable[[], None] = lambda: None,
) -> int:
    """Fire the due ticks of up to ``limit`` schedules of ``agent``; the number of
    runs started (sent). Raises what the log raises when the sends fail: then
    nothing moved on, and the ticks are fired again."""
    sent = 0

    def fire(rows: Sequence[ScheduleRow], now: datetime) -> Mapping[str, Moved]:
        nonlocal sent
        starts: list[StartRun] = []
        moved: dict[str, Moved] = {}
        for row in rows:
            s = row.schedule
            if not verifies(auth, prefix, row):
                log.error(
                    "schedule %s: its row has no valid writer MAC (not written by a "
                    "worker): not fired",
                    s.name,
                )
                continue
            ticks, next_due = due(s, row.next_due, now)
            starts += [
                StartRun(
                    command_id=command_id_for(s.name, tick),
                    run_id=run_id_for(s.name, tick),
                    agent=s.agent,
                    input_json=s.input_json,
                    at=tick,
                )
                for tick in ticks
            ]
            moved[s.name] = (next_due, ticks[-1] if ticks else None)
        if starts:
            log_.send_all(starts)  # acknowledged, or raises: nothing moves on
            after_send()  # (a crash point: before next_due moves on)
        sent = len(starts)
        return moved

    schedules.fire_due(agent, fire, limit)
    return sent


class ScheduleKeeper:
    """A worker's part in its agent's schedules (``Worker`` calls it from its poll
    loop): applies their changes and fires their due ticks."""

    def __init__(self, ports: Ports, agent: str, prefix: str, encrypts: bool) -> None:
        self._ports = ports
        self._agent = agent
        self._prefix = prefix
        self._encrypts = encrypts

    @property
    def _auth(self) -> Authenticator | None:
        auth: Authenticator | None = getattr(self._ports.log, "auth", None)
        return auth

    def change(self, command: ChangeSchedule) -> str | None:
        """Apply a change of one of this agent's schedules: None, or why not."""
        schedules = self._ports.schedules
        if schedules is None:
            return f"the {self._ports.store} store keeps no schedules"
        if self._encrypts and command.action == "set":
            return (
                f"agent {self._agent!r} encrypts its runs' payloads: a schedule's "
                "input would be kept in plain text, so it takes no schedules"
            )
        return apply_change(
            schedules, self._auth, self._prefix, command, datetime.now(UTC)
        )

    def fire(self) -> int:
        """Fire what is due; the number of runs started. Raises what the log
        raises when it is out of reach (nothing is lost: fired again later)."""
        schedules = self._ports.schedules
        if schedules is None:
            return 0
        return fire_schedules(
            schedules,
            self._ports.log,
            agent=self._agent,
            auth=self._auth,
            prefix=self._prefix,
            after_send=lambda: self._ports.probe.hit("after_send:schedule"),
        )
