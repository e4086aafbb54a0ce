"""Flow control's places and queue in Postgres (``flow_places``, ``flow_queue``;
``ports.Flow``). Every change takes the agent's advisory lock for its
transaction, so the workers of an agent count and give places one at a time.

``admit`` also frees places left behind -- a worker that died between a run's end
and its release: a place whose run has ended, or waits for something other than a
place since after it took it (by the projection, ``runs``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from es_agents.adapters.postgres import Database
from es_agents.core.flow import Limits, Queued, admit, may_take

_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))"
_QUEUE = (
    "SELECT run_id, tenant, priority, seq, since_seq FROM flow_queue "
    "WHERE topic_prefix = %s AND agent = %s ORDER BY priority DESC, seq LIMIT %s"
)


class PostgresFlow:
    def __init__(self, db: Database, prefix: str) -> None:
        self._db = db
        self._prefix = prefix

    def _lock(self, conn: Any, agent: str) -> None:
        conn.execute(_LOCK, (f"es_agents.flow/{self._prefix}/{agent}",))

    def _held(self, conn: Any, agent: str) -> dict[str | None, int]:
        rows = conn.execute(
            "SELECT tenant, count(*) FROM flow_places "
            "WHERE topic_prefix = %s AND agent = %s GROUP BY tenant",
            (self._prefix, agent),
        ).fetchall()
        return {t: n for t, n in rows}

    def take(
        self, agent: str, run_id: str, tenant: str | None, priority: int, limits: Limits
    ) -> bool:
        p = self._prefix
        with self._db.transaction() as conn:
            self._lock(conn, agent)
            if conn.execute(
                "SELECT 1 FROM flow_places WHERE topic_prefix = %s AND run_id = %s",
                (p, run_id),
            ).fetchone():
                return True
            held = self._held(conn, agent)
            if not may_take(limits, sum(held.values()), held.get(tenant, 0), tenant):
                return False
            if conn.execute(
                "SELECT 1 FROM flow_queue q WHERE q.topic_prefix = %s "
                "AND q.agent = %s AND q.run_id <> %s AND (q.priority > %s OR "
                "(q.priority = %s AND q.seq < coalesce((SELECT m.seq FROM flow_queue m "
                "WHERE m.topic_prefix = %s AND m.run_id = %s), q.seq + 1))) LIMIT 1",
                (p, agent, run_id, priority, priority, p, run_id),
            ).fetchone():
                return False  # a run queued before it goes first
            conn.execute(
                "INSERT INTO flow_places (topic_prefix, run_id, agent, tenant, since) "
                "VALUES (%s, %s, %s, %s, clock_timestamp())",
                (p, run_id, agent, tenant),
            )
            conn.execute(
                "DELETE FROM flow_queue WHERE topic_prefix = %s AND run_id = %s",
                (p, run_id),
            )
            return True

    def enqueue(
        self, agent: str, run_id: str, tenant: str | None, priority: int, since_seq: int
    ) -> None:
        with self._db.transaction() as conn:
            self._lock(conn, agent)
            # A place given between the run's ``take`` and this (an admission that
            # found its earlier row): it has nothing to wait for, and a row would
            # queue it a second time.
            conn.execute(
                "INSERT INTO flow_queue (topic_prefix, run_id, agent, tenant, "
                "priority, since_seq) SELECT %s, %s, %s, %s, %s, %s "
                "WHERE NOT EXISTS (SELECT 1 FROM flow_places "
                "WHERE topic_prefix = %s AND run_id = %s) "
                "ON CONFLICT (topic_prefix, run_id) DO UPDATE SET "
                "since_seq = EXCLUDED.since_seq",
                (
                    *(self._prefix, run_id, agent, tenant, priority, since_seq),
                    self._prefix,
                    run_id,
                ),
            )

    def release(self, run_id: str) -> None:
        with self._db.transaction() as conn:
            for table in ("flow_places", "flow_queue"):
                conn.execute(
                    f"DELETE FROM {table} WHERE topic_prefix = %s AND run_id = %s",  # noqa: S608
                    (self._prefix, run_id),
                )

    def _sweep(self, conn: Any, agent: str) -> None:
        p = self._prefix
        conn.execute(
            "DELETE FROM flow_places f USING runs r WHERE f.topic_prefix = %s "
            "AND f.agent = %s AND r.run_id = f.run_id AND ("
            "r.status IN ('completed', 'failed', 'cancelled') OR ("
            "r.status IN ('paused', 'blocked') "
            "AND coalesce(r.waiting_reason, '') <> 'queued' "
            "AND r.updated_at > f.since))",
            (p, agent),
        )
        conn.execute(
            "DELETE FROM flow_queue q USING runs r WHERE q.topic_prefix = %s "
            "AND q.agent = %s AND r.run_id = q.run_id "
            "AND r.status IN ('completed', 'failed', 'cancelled')",
            (p, agent),
        )

    def admit(
        self,
        agent: str,
        limits: Limits,
        wake: Callable[[Sequence[Queued]], None],
        limit: int = 100,
    ) -> list[Queued]:
        p = self._prefix
        with self._db.transaction() as conn:
            self._lock(conn, agent)
            self._sweep(conn, agent)
            held = self._held(conn, agent)
            if (
                limits.max_active is not None
                and sum(held.values()) >= limits.max_active
            ):
                return []
            queue = [
                Queued(*r)
                for r in conn.execute(_QUEUE, (p, agent, 1000 + limit)).fetchall()
            ]
            chosen = admit(queue, held, limits)[:limit]
            if not chosen:
                return []
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO flow_places (topic_prefix, run_id, agent, tenant, "
                    "since) VALUES (%s, %s, %s, %s, clock_timestamp()) "
                    "ON CONFLICT DO NOTHING",
                    [(p, q.run_id, agent, q.tenant) for q in chosen],
                )
            conn.execute(
                "DELETE FROM flow_queue WHERE topic_prefix = %s AND run_id = ANY(%s)",
                (p, [q.run_id for q in chosen]),
            )
            wake(chosen)  # raises: the transaction rolls back, nothing given
            return chosen

    def counts(self, agent: str) -> tuple[int, int]:
        with self._db.transaction() as conn:
            row = conn.execute(
                "SELECT (SELECT count(*) FROM flow_places WHERE topic_prefix = %s "
                "AND agent = %s), (SELECT count(*) FROM flow_queue "
                "WHERE topic_prefix = %s AND agent = %s)",
                (self._prefix, agent, self._prefix, agent),
            ).fetchone()
        return (0, 0) if row is None else (int(row[0]), int(row[1]))
