"""Runs' data keys in Postgres (``run_keys``), wrapped by the master key: the
``Vault`` port. Forgetting a run clears its wrapped key and vacuums the table, so
the key's old row version does not linger in the table's pages."""

from __future__ import annotations

import os
from typing import final

from es_agents.adapters.postgres import Database
from es_agents.errors import ConfigError
from es_agents.vault import master_key_id, unwrap, wrap


@final
class PostgresVault:
    def __init__(self, db: Database, master: bytes | None) -> None:
        self.db = db
        self.master = master

    def _master(self) -> bytes:
        if self.master is None:
            raise ConfigError(
                "this run's payloads are encrypted: set ES_AGENTS_MASTER_KEY or "
                "ES_AGENTS_MASTER_KEY_FILE to read or write them"
            )
        return self.master

    def data_key(self, run_id: str, create: bool) -> bytes | None:
        with self.db.statement() as conn:
            row = conn.execute(
                "SELECT wrapped, forgotten_at IS NOT NULL FROM run_keys "
                "WHERE run_id = %s",
                (run_id,),
            ).fetchone()
        if row is None and create:
            master = self._master()
            with self.db.transaction() as conn:
                conn.execute(
                    "INSERT INTO run_keys (run_id, wrapped, master_key_id) "
                    "VALUES (%s, %s, %s) ON CONFLICT (run_id) DO NOTHING",
                    (
                        run_id,
                        wrap(master, run_id, os.urandom(32)),
                        master_key_id(master),
                    ),
                )
            return self.data_key(run_id, create=False)
        if row is None or row[0] is None:
            return None
        return unwrap(self._master(), run_id, bytes(row[0]))

    def forget(self, run_id: str) -> bool:
        with self.db.transaction() as conn:
            row = conn.execute(
                "UPDATE run_keys SET wrapped = NULL, forgotten_at = now() "
                "WHERE run_id = %s AND wrapped IS NOT NULL RETURNING run_id",
                (run_id,),
            ).fetchone()
        if row is not None:
            with self.db.statement() as conn:
                conn.execute("VACUUM run_keys")
        return row is not None

    def forgotten(self, run_id: str) -> bool:
        with self.db.statement() as conn:
            row = conn.execute(
                "SELECT forgotten_at IS NOT NULL FROM run_keys WHERE run_id = %s",
                (run_id,),
            ).fetchone()
        return bool(row and row[0])

    def forgotten_runs(self) -> set[str]:
        with self.db.statement() as conn:
            rows = conn.execute(
                "SELECT run_id FROM run_keys WHERE forgotten_at IS NOT NULL"
            ).fetchall()
        return {str(r[0]) for r in rows}

    def rewrap(self, old: bytes) -> int:
        """Wrap every data key wrapped by ``old`` under the current master key."""
        master = self._master()
        done = 0
        with self.db.transaction() as conn:
            rows = conn.execute(
                "SELECT run_id, wrapped FROM run_keys WHERE master_key_id = %s "
                "AND wrapped IS NOT NULL FOR UPDATE",
                (master_key_id(old),),
            ).fetchall()
            for run_id, wrapped in rows:
                key = unwrap(old, run_id, bytes(wrapped))
                conn.execute(
                    "UPDATE run_keys SET wrapped = %s, master_key_id = %s "
                    "WHERE run_id = %s",
                    (wrap(master, run_id, key), master_key_id(master), run_id),
                )
                done += 1
        return done
