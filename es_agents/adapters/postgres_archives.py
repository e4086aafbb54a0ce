"""Finished runs' archives and purges in Postgres (``run_archives``,
``payload_refs``; ``ports.Archives``). The archive itself is an object in the
payload bucket (``es_agents.archive``); these rows say where it is, and a purge
deletes the run's projection rows in one transaction, checked against what was
archived."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from es_agents.adapters.postgres import Database
from es_agents.archive import Written
from es_agents.core.step import Refused
from es_agents.ports import ArchiveRow

TERMINAL = ("completed", "failed", "cancelled")


class PostgresArchives:
    def __init__(self, db: Database, decode: Any) -> None:
        self._db = db
        self._decode = decode

    def finished(self, run_id: str) -> tuple[str, int] | None:
        with self._db.statement() as conn:
            row = conn.execute(
                "SELECT status, last_seq FROM runs WHERE run_id = %s", (run_id,)
            ).fetchone()
        return None if row is None else (str(row[0]), int(row[1]))

    def archived(self, run_id: str) -> ArchiveRow | None:
        with self._db.statement() as conn:
            row = conn.execute(
                "SELECT run_id, key, sha256, events, last_seq, archived_at, purged_at "
                "FROM run_archives WHERE run_id = %s",
                (run_id,),
            ).fetchone()
        return None if row is None else ArchiveRow(*row)

    def record(
        self, run_id: str, key: str, sha256: str, events: int, last_seq: int
    ) -> None:
        with self._db.transaction() as conn:
            conn.execute(
                "INSERT INTO run_archives (run_id, key, sha256, events, last_seq) "
                "VALUES (%s, %s, %s, %s, %s) ON CONFLICT (run_id) DO UPDATE SET "
                "key = EXCLUDED.key, sha256 = EXCLUDED.sha256, "
                "events = EXCLUDED.events, last_seq = EXCLUDED.last_seq, "
                "archived_at = now(), purged_at = NULL",
                (run_id, key, sha256, events, last_seq),
            )

    def purge(self, run_id: str) -> list[str]:
        with self._db.transaction() as conn:
            archive = conn.execute(
                "SELECT last_seq, purged_at FROM run_archives WHERE run_id = %s "
                "FOR UPDATE",
                (run_id,),
            ).fetchone()
            if archive is None:
                raise Refused(f"run {run_id} has no archive: archive it first")
            run = conn.execute(
                "SELECT status, last_seq FROM runs WHERE run_id = %s FOR UPDATE",
                (run_id,),
            ).fetchone()
            if run is None or run[0] not in TERMINAL:
                raise Refused(f"run {run_id} is {run[0] if run else 'unknown'}")
            if int(run[1]) != int(archive[0]):
                raise Refused(
                    f"run {run_id} has events up to seq {run[1]}, its archive up "
                    f"to {archive[0]}: archive it again"
                )
            for table in (
                "run_events",
                "run_tails",
                "run_snapshots",
                "run_transcripts",
            ):
                conn.execute(
                    f"DELETE FROM {table} WHERE run_id = %s",  # noqa: S608
                    (run_id,),
                )
            orphans = self._unclaim(conn, run_id)
            conn.execute(
                "UPDATE run_archives SET purged_at = now() WHERE run_id = %s",
                (run_id,),
            )
        return orphans

    def unclaim(self, run_id: str) -> list[str]:
        with self._db.transaction() as conn:
            return self._unclaim(conn, run_id)

    @staticmethod
    def _unclaim(conn: Any, run_id: str) -> list[str]:
        """The run's claims on payload objects removed; the objects no run claims
        any more (to delete once the transaction committed)."""
        keys = [
            str(r[0])
            for r in conn.execute(
                "DELETE FROM payload_refs WHERE run_id = %s RETURNING key", (run_id,)
            ).fetchall()
        ]
        if not keys:
            return []
        still = {
            str(r[0])
            for r in conn.execute(
                "SELECT DISTINCT key FROM payload_refs WHERE key = ANY(%s)", (keys,)
            ).fetchall()
        }
        orphans = sorted(set(keys) - still)
        conn.execute(
            "INSERT INTO payload_orphans (key) SELECT unnest(%s::text[]) "
            "ON CONFLICT DO NOTHING",
            (orphans,),
        )
        return orphans

    def orphaned(self, limit: int = 1000) -> list[str]:
        with self._db.transaction() as conn:
            conn.execute(  # claimed again since: not an orphan any more
                "DELETE FROM payload_orphans o WHERE EXISTS "
                "(SELECT 1 FROM payload_refs r WHERE r.key = o.key)"
            )
            rows = conn.execute(
                "SELECT key FROM payload_orphans ORDER BY since LIMIT %s", (limit,)
            ).fetchall()
        return [str(r[0]) for r in rows]

    def settle(self, keys: list[str]) -> None:
        with self._db.transaction() as conn:
            conn.execute("DELETE FROM payload_orphans WHERE key = ANY(%s)", (keys,))

    def restore(self, run_id: str, rows: list[Written], keys: list[str]) -> None:
        events = [(w, self._decode(w.value)) for w in rows]
        with self._db.transaction() as conn:
            archive = conn.execute(
                "SELECT purged_at FROM run_archives WHERE run_id = %s FOR UPDATE",
                (run_id,),
            ).fetchone()
            if archive is None or archive[0] is None:
                raise Refused(f"run {run_id} is not purged: nothing to restore")
            with conn.cursor() as cur:
                cur.executemany(
                    "INSERT INTO run_events (run_id, seq, step, type, at, partition, "
                    '"offset") VALUES (%s, %s, %s, %s, %s, %s, %s) '
                    "ON CONFLICT DO NOTHING",
                    [_event_row(run_id, w, e) for w, e in events],
                )
                # No snapshot comes back: a resume folds the whole run from here.
                cur.executemany(
                    "INSERT INTO run_tails (run_id, seq, payload, mac) "
                    "VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
                    [(run_id, w.seq, w.value, w.mac) for w in rows],
                )
                cur.executemany(
                    "INSERT INTO payload_refs (key, run_id) VALUES (%s, %s) "
                    "ON CONFLICT DO NOTHING",
                    [(key, run_id) for key in keys],
                )
            conn.execute(
                "UPDATE run_archives SET purged_at = NULL WHERE run_id = %s",
                (run_id,),
            )

    def purged(self, run_prefix: str = "") -> set[str]:
        with self._db.statement() as conn:
            rows = conn.execute(
                "SELECT run_id FROM run_archives WHERE purged_at IS NOT NULL "
                "AND starts_with(run_id, %s)",
                (run_prefix,),
            ).fetchall()
        return {str(r[0]) for r in rows}

    def due(self, agent: str, ended_before: datetime, limit: int) -> list[str]:
        with self._db.statement() as conn:
            rows = conn.execute(
                "SELECT r.run_id FROM runs r LEFT JOIN run_archives a "
                "ON a.run_id = r.run_id WHERE r.agent = %s AND r.status = ANY(%s) "
                "AND r.updated_at < %s AND a.purged_at IS NULL "
                "ORDER BY r.updated_at LIMIT %s",
                (agent, list(TERMINAL), ended_before, limit),
            ).fetchall()
        return [str(r[0]) for r in rows]


def _event_row(run_id: str, w: Written, e: Any) -> tuple[Any, ...]:
    return (run_id, w.seq, e.step, e.wire_name, e.at, w.partition, w.offset)
