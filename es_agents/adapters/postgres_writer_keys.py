"""The writer keys in Postgres (``writer_keys``): the first worker or projector makes
one; a role that may not read them (a client, a reader) gets none and verifies
nothing (``core.authorship``)."""

from __future__ import annotations

import logging
import os
from typing import Any

import psycopg

from es_agents.adapters.postgres import Database
from es_agents.core.authorship import KEY_BYTES, Authenticator
from es_agents.errors import Forbidden

log = logging.getLogger(__name__)

FIRST_KEY = "w1"


def writer_keys(db: Database) -> Authenticator | None:
    """The keys, newest signing; the first is made when there is none (by a role
    that may). None when this role may not read them."""
    try:
        with db.transaction() as conn:
            found = conn.execute("SELECT to_regclass('writer_keys')").fetchone()
            if found is None or found[0] is None:
                return None  # not migrated yet
            rows = _keys(conn)
            if not rows:
                conn.execute(
                    "INSERT INTO writer_keys (key_id, secret) VALUES (%s, %s) "
                    "ON CONFLICT (key_id) DO NOTHING",
                    (FIRST_KEY, os.urandom(KEY_BYTES)),
                )
                rows = _keys(conn)
    except (Forbidden, psycopg.errors.InsufficientPrivilege) as e:
        log.debug("no writer keys: %s", e)  # a role that may not read them
        return None
    if not rows:
        return None
    keys = {str(k): bytes(v) for k, v in rows}
    return Authenticator(keys, str(rows[-1][0]))


def _keys(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT key_id, secret FROM writer_keys ORDER BY created_at, key_id"
    ).fetchall()
