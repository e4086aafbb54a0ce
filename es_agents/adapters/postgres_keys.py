"""Approvers' public keys in Postgres (``approver_keys``): the ``Keyring`` port."""

from __future__ import annotations

from typing import Any, final

import psycopg

from es_agents.adapters.postgres import Database
from es_agents.core.approvals import ApproverKey
from es_agents.errors import ConfigError


@final
class PostgresKeyring:
    def __init__(self, db: Database) -> None:
        self.db = db

    def get(self, key_id: str) -> ApproverKey | None:
        with self.db.statement() as conn:
            row = conn.execute(
                "SELECT key_id, identity, roles, public_key, revoked_at IS NOT NULL "
                "FROM approver_keys WHERE key_id = %s",
                (key_id,),
            ).fetchone()
        return _key(row) if row is not None else None

    def add(self, key: ApproverKey) -> None:
        try:
            with self.db.transaction() as conn:
                conn.execute(
                    "INSERT INTO approver_keys (key_id, identity, roles, public_key) "
                    "VALUES (%s, %s, %s, %s)",
                    (key.key_id, key.identity, sorted(key.roles), key.public_key),
                )
        except psycopg.errors.UniqueViolation as e:
            raise ConfigError(f"key {key.key_id} is already registered") from e

    def revoke(self, key_id: str) -> bool:
        with self.db.transaction() as conn:
            row = conn.execute(
                "UPDATE approver_keys SET revoked_at = coalesce(revoked_at, now()) "
                "WHERE key_id = %s RETURNING key_id",
                (key_id,),
            ).fetchone()
        return row is not None

    def all(self) -> list[ApproverKey]:
        with self.db.statement() as conn:
            rows = conn.execute(
                "SELECT key_id, identity, roles, public_key, revoked_at IS NOT NULL "
                "FROM approver_keys ORDER BY identity, key_id"
            ).fetchall()
        return [_key(r) for r in rows]


def _key(row: tuple[Any, ...]) -> ApproverKey:
    key_id, identity, roles, public, revoked = row
    return ApproverKey(
        str(key_id), str(identity), frozenset(roles or ()), bytes(public), bool(revoked)
    )
