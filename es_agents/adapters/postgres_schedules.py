"""Schedules in Postgres (``schedules``, one row per schedule of a topic prefix).
Due schedules are claimed for a while (``claimed_until``, taken ``FOR UPDATE SKIP
LOCKED``), so the workers of an agent share them and a tick is in one worker's
hands at a time, with no transaction open while its runs are started (a start
waiting out a broker's failover outlasted the session's idle-in-transaction limit).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from es_agents.adapters.postgres import CLAIM_SECONDS, Database
from es_agents.core.schedules import InvalidSchedule, Schedule, run_id_for
from es_agents.errors import Unavailable
from es_agents.ports import Moved, ScheduleRow

_COLUMNS = (
    "name, agent, input_json, cron, every_seconds, missed, created_at, paused, "
    "next_due, mac, last_tick, last_run_id, updated_at"
)


def _row(r: tuple[Any, ...]) -> ScheduleRow | None:
    try:
        schedule = Schedule(
            name=r[0],
            agent=r[1],
            input_json=r[2],
            cron=r[3],
            every_seconds=r[4],
            missed=r[5],
            created_at=r[6],
            paused=r[7],
        )
    except InvalidSchedule:
        return None  # not a worker's row (workers write valid ones): never fired
    return ScheduleRow(schedule, r[8], r[9], r[10], r[11], r[12])


class PostgresSchedules:
    def __init__(self, db: Database, prefix: str) -> None:
        self._db = db
        self._prefix = prefix

    def put(self, row: ScheduleRow) -> None:
        s = row.schedule
        with self._db.transaction() as conn:
            conn.execute(
                f"INSERT INTO schedules (topic_prefix, {_COLUMNS}) VALUES "  # noqa: S608
                "(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, now()) "
                "ON CONFLICT (topic_prefix, name) DO UPDATE SET "
                "agent = EXCLUDED.agent, input_json = EXCLUDED.input_json, "
                "cron = EXCLUDED.cron, every_seconds = EXCLUDED.every_seconds, "
                "missed = EXCLUDED.missed, created_at = EXCLUDED.created_at, "
                "paused = EXCLUDED.paused, next_due = EXCLUDED.next_due, "
                "mac = EXCLUDED.mac, updated_at = now()",
                (
                    self._prefix,
                    s.name,
                    s.agent,
                    s.input_json,
                    s.cron,
                    s.every_seconds,
                    s.missed,
                    s.created_at,
                    s.paused,
                    row.next_due,
                    row.mac,
                    row.last_tick,
                    row.last_run_id,
                ),
            )

    def delete(self, name: str) -> bool:
        with self._db.transaction() as conn:
            cur = conn.execute(
                "DELETE FROM schedules WHERE topic_prefix = %s AND name = %s",
                (self._prefix, name),
            )
            return cur.rowcount > 0

    def get(self, name: str) -> ScheduleRow | None:
        with self._db.transaction() as conn:
            r = conn.execute(
                f"SELECT {_COLUMNS} FROM schedules "  # noqa: S608
                "WHERE topic_prefix = %s AND name = %s",
                (self._prefix, name),
            ).fetchone()
        return None if r is None else _row(r)

    def list(self, agent: str | None = None) -> list[ScheduleRow]:
        with self._db.transaction() as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM schedules WHERE topic_prefix = %s "  # noqa: S608
                "AND (%s::text IS NULL OR agent = %s) ORDER BY name",
                (self._prefix, agent, agent),
            ).fetchall()
        return [row for r in rows if (row := _row(r)) is not None]

    def fire_due(
        self,
        agent: str,
        fire: Callable[[Sequence[ScheduleRow], datetime], Mapping[str, Moved]],
        limit: int = 100,
    ) -> int:
        """Claim the due schedules, ``fire`` them, then move each to its next due
        time -- unless it was changed meanwhile (the change stands). ``fire``
        raising gives the claims up; a crash leaves them to the claim's end."""
        with self._db.transaction() as conn:
            found = conn.execute(
                f"UPDATE schedules SET claimed_until = now() + make_interval("  # noqa: S608
                "secs => %s) WHERE (topic_prefix, name) IN (SELECT topic_prefix, "
                "name FROM schedules WHERE topic_prefix = %s AND agent = %s AND NOT "
                "paused AND next_due <= now() AND (claimed_until IS NULL OR "
                "claimed_until < now()) ORDER BY next_due LIMIT %s FOR UPDATE SKIP "
                f"LOCKED) RETURNING {_COLUMNS}, now()",
                (CLAIM_SECONDS, self._prefix, agent, limit),
            ).fetchall()
        if not found:
            return 0
        found.sort(key=lambda r: r[8])  # by next_due
        now: datetime = found[0][-1]
        claimed = {r[0]: r[12] for r in found}  # name: updated_at
        rows = [row for r in found if (row := _row(r[:-1])) is not None]
        try:
            moved = fire(rows, now)
        except BaseException:
            with contextlib.suppress(Unavailable), self._db.transaction() as conn:
                conn.execute(
                    "UPDATE schedules SET claimed_until = NULL WHERE topic_prefix = "
                    "%s AND name = ANY(%s)",
                    (self._prefix, list(claimed)),
                )
            raise
        with self._db.transaction() as conn:
            for name, (next_due, tick) in moved.items():
                conn.execute(
                    "UPDATE schedules SET next_due = %s, "
                    "last_tick = coalesce(%s, last_tick), "
                    "last_run_id = coalesce(%s, last_run_id) "
                    "WHERE topic_prefix = %s AND name = %s "
                    "AND updated_at IS NOT DISTINCT FROM %s",
                    (
                        next_due,
                        tick,
                        None if tick is None else run_id_for(name, tick),
                        self._prefix,
                        name,
                        claimed.get(name),
                    ),
                )
            conn.execute(
                "UPDATE schedules SET claimed_until = NULL WHERE topic_prefix = %s "
                "AND name = ANY(%s)",
                (self._prefix, list(claimed)),
            )
        return len(found)
