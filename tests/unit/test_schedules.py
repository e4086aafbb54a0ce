"""Schedules, without services: when ticks fall, what a missed-tick policy fires,
and a worker's part (apply a change, fire due ticks) on the memory store."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from es_agents.adapters.memory import MemorySchedules
from es_agents.core.authorship import Authenticator
from es_agents.core.commands import ChangeSchedule, StartRun
from es_agents.core.schedules import (
    CATCH_UP,
    InvalidSchedule,
    Missed,
    Schedule,
    due,
    first_due,
    key_for,
    next_tick,
    run_id_for,
)
from es_agents.ports import Position, ScheduleRow
from es_agents.runtime.schedules import apply_change, fire_schedules

T0 = datetime(2026, 12, 5, 12, 0, 0, tzinfo=UTC)
AUTH = Authenticator({"k1": b"k" * 32}, "k1")


def every(seconds: int, missed: Missed = "skip", at: datetime = T0) -> Schedule:
    return Schedule("tick", "tickets", '{"n": 1}', missed, at, every_seconds=seconds)


def cron(expr: str, missed: Missed = "skip") -> Schedule:
    return Schedule("nightly", "tickets", "{}", missed, T0, cron=expr)


def test_interval_ticks_count_from_the_schedules_creation() -> None:
    s = every(60, at=T0 + timedelta(seconds=7))
    assert first_due(s, T0 + timedelta(seconds=7)) == T0 + timedelta(seconds=67)
    assert next_tick(s, T0 + timedelta(seconds=67)) == T0 + timedelta(seconds=127)
    # Never a tick before the schedule was made.
    assert next_tick(s, T0 - timedelta(days=3)) == T0 + timedelta(seconds=7)


def test_cron_ticks_are_in_utc() -> None:
    s = cron("30 2 * * *")
    assert first_due(s, T0) == datetime(2026, 12, 6, 2, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        ({"every_seconds": 0}, "interval"),
        ({"cron": "61 * * * *"}, "cron expression"),
        ({"cron": "* * * * *", "every_seconds": 5}, "not both"),
        ({}, "either"),
        ({"every_seconds": 5, "name": "bad name"}, "schedule name"),
        ({"every_seconds": 5, "input_json": "{not json"}, "not JSON"),
        ({"every_seconds": 5, "missed": "some"}, "missed-tick policy"),
    ],
)
def test_a_schedule_that_cannot_be_kept_says_why(
    kwargs: dict[str, object], why: str
) -> None:
    base: dict[str, object] = {
        "name": "ok",
        "agent": "tickets",
        "input_json": "{}",
        "missed": "skip",
        "created_at": T0,
    }
    with pytest.raises(InvalidSchedule, match=why):
        Schedule(**{**base, **kwargs})  # type: ignore[arg-type]


def test_on_time_one_tick_fires_whatever_the_policy() -> None:
    for missed in ("skip", "one", "all"):
        s = every(60, missed)
        tick = T0 + timedelta(seconds=60)
        assert due(s, tick, tick + timedelta(seconds=1)) == (
            [tick],
            tick + timedelta(seconds=60),
        )


def test_missed_ticks_follow_the_policy() -> None:
    # Nothing fired for ten minutes of a one-minute schedule: ticks 1..10 due.
    first = T0 + timedelta(minutes=1)
    now = T0 + timedelta(minutes=10, seconds=30)
    ticks = [T0 + timedelta(minutes=k) for k in range(1, 11)]
    after = T0 + timedelta(minutes=11)
    assert due(every(60, "all"), first, now) == (ticks, after)
    assert due(every(60, "one"), first, now) == ([ticks[-1]], after)
    # skip: the latest is 30 s late, half a period: still on time.
    assert due(every(60, "skip"), first, now) == ([ticks[-1]], after)
    # ...but 31 s late it is missed too.
    late = T0 + timedelta(minutes=10, seconds=31)
    assert due(every(60, "skip"), first, late) == ([], after)
    # Half a period of 10 s: 5 s.
    s = every(10, "skip")
    assert due(s, T0 + timedelta(seconds=10), T0 + timedelta(seconds=36)) == (
        [],
        T0 + timedelta(seconds=40),
    )
    # Never less than 2 s, never more than a minute.
    assert due(
        every(1, "skip"), T0 + timedelta(seconds=1), T0 + timedelta(seconds=6.5)
    )[0] == [T0 + timedelta(seconds=6)]
    hourly = every(3600, "skip")
    assert (
        due(hourly, T0 + timedelta(hours=1), T0 + timedelta(hours=1, seconds=61))[0]
        == []
    )


def test_all_catches_up_in_passes_of_bounded_size() -> None:
    s = every(1, "all")
    now = T0 + timedelta(seconds=1000)
    fired, after = due(s, T0 + timedelta(seconds=1), now)
    assert len(fired) == CATCH_UP
    assert after == fired[-1] + timedelta(seconds=1)
    more, _ = due(s, after, now)
    assert more[0] == after  # the next pass goes on where this one stopped


def test_a_paused_schedule_fires_nothing() -> None:
    s = every(60).paused_as(True)
    assert due(s, T0, T0 + timedelta(hours=1)) == ([], T0)


class Sent:
    def __init__(self) -> None:
        self.commands: list[StartRun] = []
        self.fail = False

    def send_all(self, commands: list[StartRun]) -> list[Position]:
        if self.fail:
            from es_agents.errors import AppendError  # noqa: PLC0415

            raise AppendError("the broker is down")
        self.commands += commands
        return [Position("c", 0, i) for i, _ in enumerate(commands)]


def change(action: str, **spec: object) -> ChangeSchedule:  # input "{}"
    return ChangeSchedule(
        run_id=key_for("tick"),
        by="ops",
        agent="tickets",
        name="tick",
        action=action,
        at=T0,
        **spec,
    )


def kept(clock: Callable[[], datetime]) -> MemorySchedules:
    schedules = MemorySchedules(clock)
    assert (
        apply_change(schedules, AUTH, "p", change("set", every_seconds=60), T0) is None
    )
    return schedules


def fire(schedules: MemorySchedules, sent: Sent, auth: Authenticator = AUTH) -> int:
    return fire_schedules(schedules, sent, agent="tickets", auth=auth, prefix="p")  # type: ignore[arg-type]


def test_each_tick_starts_one_run_with_an_id_of_its_own() -> None:
    now = [T0 + timedelta(seconds=61)]
    schedules, sent = kept(lambda: now[0]), Sent()
    assert fire(schedules, sent) == 1
    assert fire(schedules, sent) == 0  # not due again
    now[0] += timedelta(seconds=60)
    assert fire(schedules, sent) == 1
    ids = [c.run_id for c in sent.commands]
    assert ids == [
        run_id_for("tick", T0 + timedelta(seconds=60)),
        run_id_for("tick", T0 + timedelta(seconds=120)),
    ]
    assert [c.command_id for c in sent.commands] != ids
    assert {(c.agent, c.input_json) for c in sent.commands} == {("tickets", "{}")}
    row = schedules.get("tick")
    assert row is not None
    assert row.last_run_id == ids[-1]


def test_a_failed_send_moves_nothing_on() -> None:
    now = [T0 + timedelta(seconds=61)]
    schedules, sent = kept(lambda: now[0]), Sent()
    sent.fail = True
    from es_agents.errors import AppendError  # noqa: PLC0415

    with pytest.raises(AppendError):
        fire(schedules, sent)
    sent.fail = False
    assert fire(schedules, sent) == 1  # the same tick, sent once it can be
    assert sent.commands[0].run_id == run_id_for("tick", T0 + timedelta(seconds=60))


def test_a_row_not_signed_by_a_worker_starts_nothing() -> None:
    now = [T0 + timedelta(seconds=61)]
    schedules, sent = kept(lambda: now[0]), Sent()
    row = schedules.get("tick")
    assert row is not None
    forged = Schedule(
        "tick", "tickets", '{"wire": "all funds"}', "skip", T0, every_seconds=60
    )
    schedules.put(ScheduleRow(forged, row.next_due, row.mac))  # the old MAC
    assert fire(schedules, sent) == 0
    other = Authenticator({"k2": b"x" * 32}, "k2")
    assert (
        apply_change(schedules, other, "p", change("set", every_seconds=60), T0) is None
    )
    assert fire(schedules, sent, auth=AUTH) == 0  # signed under a key not ours
    assert sent.commands == []


def test_pause_resume_and_delete() -> None:
    now = [T0 + timedelta(seconds=30)]
    schedules, sent = kept(lambda: now[0]), Sent()
    assert apply_change(schedules, AUTH, "p", change("pause"), now[0]) is None
    now[0] = T0 + timedelta(minutes=5)
    assert fire(schedules, sent) == 0
    assert apply_change(schedules, AUTH, "p", change("resume"), now[0]) is None
    assert fire(schedules, sent) == 0  # from the next tick on, none of the paused ones
    now[0] = T0 + timedelta(minutes=6, seconds=1)
    assert fire(schedules, sent) == 1
    assert apply_change(schedules, AUTH, "p", change("delete"), now[0]) is None
    assert schedules.list() == []
    assert (
        apply_change(schedules, AUTH, "p", change("pause"), now[0])
        == "no schedule 'tick'"
    )


def test_a_change_that_cannot_be_kept_is_refused_with_the_reason() -> None:
    schedules = MemorySchedules()
    why = apply_change(schedules, AUTH, "p", change("set", cron="every day"), T0)
    assert why is not None
    assert "cron expression" in why
    other_agent = change("set", every_seconds=5).model_copy(update={"agent": "billing"})
    kept_one = kept(lambda: T0)
    why = apply_change(kept_one, AUTH, "p", other_agent, T0)
    assert why is not None
    assert "belongs to agent 'tickets'" in why
    assert (
        apply_change(schedules, None, "p", change("set", every_seconds=5), T0)
        is not None
    )
