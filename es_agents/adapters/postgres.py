"""Postgres adapters: migrations, the effect ledger and durable timers.

Every psycopg error becomes one of ours at this boundary, with ``raise ... from``.
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from typing import Any, final

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from es_agents.adapters.postgres_stalls import APPLICATION, StallReaper
from es_agents.errors import ConfigError, Forbidden, Unavailable
from es_agents.ports import Due, EffectRecord, EffectStatus
from es_agents.settings import KAFKA_PREFIX, POSTGRES_PREFIX

_MIGRATION = re.compile(r"^(?P<version>\d{4})_(?P<name>[a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def migrations() -> list[Migration]:
    """The SQL files in ``projectors/sql``, in version order."""
    found = []
    for entry in resources.files("projectors").joinpath("sql").iterdir():
        match = _MIGRATION.match(entry.name)
        if match:
            found.append(
                Migration(int(match["version"]), match["name"], entry.read_text())
            )
    return sorted(found, key=lambda m: m.version)


def _probe(url: str, connect_timeout: int) -> None:
    """One connection before the pool's: what is wrong is said at once and by name
    (a pool would retry a refused connection or a missing database until its
    timeout, then report only that nobody answered)."""
    try:
        psycopg.connect(url, connect_timeout=connect_timeout).close()
    except psycopg.OperationalError as e:
        reason = " ".join(line.strip() for line in str(e).splitlines()) or repr(e)
        where = f"Postgres at {_safe(url)}"
        missing = re.search(r'database "([^"]+)" does not exist', str(e))
        if missing:
            name = missing.group(1)
            raise ConfigError(
                f"{where}: database {name!r} does not exist: create it "
                f'(CREATE DATABASE "{name}"; or `createdb {name}` as a role that '
                "may) or point ES_AGENTS_DATABASE_URL at one that does"
            ) from e
        if "password authentication failed" in reason or "role" in reason:
            raise ConfigError(
                f"{where}: {reason} (the user and password in ES_AGENTS_DATABASE_URL)"
            ) from e
        raise Unavailable(
            f"{where}: {reason} (ES_AGENTS_DATABASE_URL; the dev stack starts with "
            "`es-agents dev up`)"
        ) from e


class Database:
    """A small connection pool with errors translated at the boundary."""

    def __init__(
        self,
        url: str,
        max_size: int = 8,
        timeout: float = 30.0,
        idle_in_transaction: float = 45.0,
        end_stalled: float | None = None,
    ) -> None:
        """``timeout``: seconds to wait for a connection before ``Unavailable``.
        ``idle_in_transaction``: the server ends a session of ours that sat that long
        inside a transaction -- a paused or hung process must not keep row locks
        (a partition's epoch, a lease) that its successor waits on forever.
        ``end_stalled``: this process ends, after that many seconds, the sessions
        of ours that a paused process left in the middle of a pipeline, which the
        server's idle timeout never ends (``postgres_stalls``); workers and
        projectors do, clients do not."""
        self.url = url
        self.timeout = timeout
        kwargs: dict[str, Any] = {
            "autocommit": False,
            "application_name": APPLICATION,
            "options": "-c idle_in_transaction_session_timeout="
            f"{max(1, round(idle_in_transaction * 1000))}",
        }
        if timeout < 30:
            kwargs["connect_timeout"] = max(2, math.ceil(timeout))  # libpq's minimum
        self._reaper: StallReaper | None = None
        _probe(url, kwargs.get("connect_timeout", max(2, math.ceil(timeout))))
        try:
            self.pool = ConnectionPool(
                url,
                min_size=1,
                max_size=max_size,
                open=True,
                timeout=timeout,
                kwargs=kwargs,
            )
        except psycopg.Error as e:
            raise Unavailable(f"postgres at {_safe(url)}: {e}") from e
        if end_stalled is not None:
            self._reaper = StallReaper(url, end_stalled, max(2, math.ceil(timeout)))

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Connection[tuple[Any, ...]]]:
        with self._translated(), self.pool.connection() as conn, conn.transaction():
            yield conn

    @contextmanager
    def statement(self) -> Iterator[psycopg.Connection[tuple[Any, ...]]]:
        """A connection for one statement outside a transaction: one round trip
        (a single statement sees one consistent snapshot by itself)."""
        with self._translated(), self.pool.connection() as conn:
            conn.autocommit = True
            try:
                yield conn
            finally:
                if not conn.closed:
                    conn.autocommit = False

    @contextmanager
    def _translated(self) -> Iterator[None]:
        """The database's own errors, translated at the boundary."""
        try:
            yield
        except PoolTimeout as e:
            raise Unavailable(
                f"Postgres at {_safe(self.url)} did not answer within "
                f"{self.timeout:g} s (ES_AGENTS_DATABASE_URL; the dev stack starts "
                "with `es-agents dev up`)"
            ) from e
        except (
            psycopg.OperationalError,
            psycopg.errors.IdleInTransactionSessionTimeout,  # the server ended it
        ) as e:
            raise Unavailable(f"postgres: {e}") from e
        except psycopg.errors.InsufficientPrivilege as e:
            raise Forbidden(
                f"postgres refused: {e.diag.message_primary} (the role in "
                "ES_AGENTS_DATABASE_URL may not do this; see the README's Security)"
            ) from e
        except psycopg.errors.UndefinedTable as e:
            raise ConfigError(
                f"the database has no es-agents tables ({e.diag.message_primary}): "
                "run `es-agents migrate` (workers and projectors do it on start)"
            ) from e

    def migrate(self, dry_run: bool = False) -> list[Migration]:
        """Apply the migrations not applied yet (each in its own transaction).
        Up to date, it only reads: a role without DDL rights starts too."""
        if not dry_run and self._applied() >= {m.version for m in migrations()}:
            return []
        with self.transaction() as conn:
            # Workers and projectors start together: one migrates, the rest wait.
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            conn.execute(
                "CREATE TABLE IF NOT EXISTS es_schema_migrations ("
                " version integer PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            conn.execute("LOCK TABLE es_schema_migrations IN EXCLUSIVE MODE")
            done = {
                row[0]
                for row in conn.execute("SELECT version FROM es_schema_migrations")
            }
            todo = [m for m in migrations() if m.version not in done]
            if dry_run:
                return todo
            for migration in todo:
                conn.execute(migration.sql.encode())
                conn.execute(
                    "INSERT INTO es_schema_migrations (version, name) VALUES (%s, %s)",
                    (migration.version, migration.name),
                )
        return todo

    def _applied(self) -> set[int]:
        with self.statement() as conn:
            found = conn.execute(
                "SELECT to_regclass('es_schema_migrations') IS NOT NULL"
            ).fetchone()
            if not found or not found[0]:
                return set()
            return {
                int(r[0])
                for r in conn.execute("SELECT version FROM es_schema_migrations")
            }

    def close(self) -> None:
        if self._reaper is not None:
            self._reaper.close()
        self.pool.close()


# A due timer or schedule claimed by a worker is left to it this long; not marked
# fired by then (the worker died while sending its commands), it is due again.
CLAIM_SECONDS = 30.0
MIGRATION_LOCK = 0x65_73_61_67  # "esag": the advisory lock taken while migrating


def _safe(url: str) -> str:
    return re.sub(r"://([^:@/]+):[^@/]+@", r"://\1:***@", url)


@final
class PostgresEffectLedger:
    """The dedupe table: at most one call per idempotency key for tools that cannot
    honor keys themselves."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def begin(self, key: str, run_id: str, step: int, tool: str) -> EffectRecord:
        """Claim ``key`` before calling; ``new`` means: call now, then ``finish``."""
        with self._db.transaction() as conn:
            inserted = conn.execute(
                "INSERT INTO effects (idempotency_key, run_id, step, tool, status) "
                "VALUES (%s, %s, %s, %s, 'started') ON CONFLICT DO NOTHING",
                (key, run_id, step, tool),
            ).rowcount
            if inserted == 1:
                return EffectRecord("new")
        return self.get(key) or EffectRecord("new")

    def finish(self, key: str, result_json: str | None, error: str | None) -> None:
        with self._db.transaction() as conn:
            updated = conn.execute(
                "UPDATE effects SET status = 'done', result_json = %s, error = %s, "
                "finished_at = now() WHERE idempotency_key = %s AND status = 'started'",
                (result_json, error, key),
            ).rowcount
        if updated != 1:
            raise ConfigError(f"effect {key} was not started, or already finished")

    def release(self, key: str) -> None:
        """Drop a claim whose call provably did not happen (the downstream refused
        the caller's fencing token), so the partition's owner can make it."""
        with self._db.transaction() as conn:
            conn.execute(
                "DELETE FROM effects WHERE idempotency_key = %s AND status = 'started'",
                (key,),
            )

    def entries(self, run_prefix: str = "") -> list[tuple[str, str, EffectStatus]]:
        with self._db.transaction() as conn:
            rows = conn.execute(
                "SELECT idempotency_key, run_id, status FROM effects "
                "WHERE starts_with(run_id, %s)",
                (run_prefix,),
            ).fetchall()
        return [(str(k), str(r), s) for k, r, s in rows]

    def get(self, key: str) -> EffectRecord | None:
        with self._db.transaction() as conn:
            row = conn.execute(
                "SELECT status, result_json, error FROM effects "
                "WHERE idempotency_key = %s",
                (key,),
            ).fetchone()
        if row is None:
            return None
        status, result_json, error = row
        return EffectRecord(status, result_json, error)


@final
class PostgresTimers:
    """Durable timers, due by the database's clock."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def schedule(self, timer_id: str, run_id: str, due_at: datetime) -> None:
        with self._db.transaction() as conn:
            conn.execute(
                # The same sleep scheduled again (its `interrupted` was not committed
                # the first time, and the timer may have fired at a run that was not
                # asleep yet): arm it again.
                "INSERT INTO timers (timer_id, run_id, due_at) VALUES (%s, %s, %s) "
                "ON CONFLICT (timer_id) DO UPDATE "
                "SET due_at = EXCLUDED.due_at, fired_at = NULL, claimed_until = NULL",
                (timer_id, run_id, due_at),
            )

    def fire_due(self, fire: Callable[[Sequence[Due]], None], limit: int = 1000) -> int:
        """Claim up to ``limit`` due timers, call ``fire`` with them, then mark them.

        ``fire`` must make the wake-ups durable (send the commands) before returning.
        The claim is a lease (``claimed_until``, ``CLAIM_SECONDS``) committed
        before ``fire``: no transaction stays open while the wake-ups are sent (a
        send waiting out a broker's failover outlasted the session's
        idle-in-transaction limit, and the server ended the worker's session). If
        ``fire`` raises, the claim is given up; a crash before the mark fires them
        again once the lease has ended. The runs ignore a timer that does not wake
        them.
        """
        with self._db.transaction() as conn:
            rows: list[Due] = conn.execute(
                "UPDATE timers SET claimed_until = now() + make_interval(secs => %s) "
                "WHERE timer_id IN (SELECT timer_id FROM timers WHERE fired_at IS NULL "
                "AND due_at <= now() AND (claimed_until IS NULL OR claimed_until < "
                "now()) ORDER BY due_at LIMIT %s FOR UPDATE SKIP LOCKED) "
                "RETURNING timer_id, run_id, due_at",
                (CLAIM_SECONDS, limit),
            ).fetchall()
        if not rows:
            return 0
        rows.sort(key=lambda r: r[2])
        ids = [r[0] for r in rows]
        try:
            fire(rows)
        except BaseException:
            with contextlib.suppress(Unavailable), self._db.transaction() as conn:
                conn.execute(
                    "UPDATE timers SET claimed_until = NULL WHERE timer_id = ANY(%s)",
                    (ids,),
                )
            raise
        with self._db.transaction() as conn:
            conn.execute(
                "UPDATE timers SET fired_at = now(), claimed_until = NULL "
                "WHERE timer_id = ANY(%s)",
                (ids,),
            )
        return len(rows)

    def get(self, timer_id: str) -> tuple[datetime, datetime | None] | None:
        with self._db.transaction() as conn:
            row = conn.execute(
                "SELECT due_at, fired_at FROM timers WHERE timer_id = %s", (timer_id,)
            ).fetchone()
        return None if row is None else (row[0], row[1])


def check_layout(db: Database, prefix: str, partitions: int | None, store: str) -> None:
    """Record the store and partition count a prefix's runs are placed with (the
    first time), and refuse another: a run's partition is ``murmur2(run_id) mod
    count``, and its records, offsets and projections are named by the prefix's
    topics, which the other store has too. ``partitions=None``: check the store
    only, recording nothing (before the topics are created). (Before the
    migrations ran there is nothing to check against.)"""
    with db.transaction() as conn:
        exists = conn.execute("SELECT to_regclass('topic_layout')").fetchone()
        if exists is None or exists[0] is None:
            return
        if partitions is not None:
            conn.execute(
                "INSERT INTO topic_layout (topic_prefix, partitions, store) "
                "VALUES (%s, %s, %s) ON CONFLICT (topic_prefix) DO NOTHING",
                (prefix, partitions, store),
            )
        row = conn.execute(
            "SELECT partitions, store FROM topic_layout WHERE topic_prefix = %s",
            (prefix,),
        ).fetchone()
    if row is None:
        return
    recorded, owner = int(row[0]), str(row[1])
    if owner != store:
        raise ConfigError(
            f"topic prefix {prefix!r} in this database belongs to the {owner} store "
            f"(its runs, offsets and projections), not to the {store} store this "
            f"process uses: set ES_AGENTS_TOPIC_PREFIX to a prefix of the {store} "
            f"store (its default is {default_prefix(store)!r}) or use another "
            "database. Runs do not move between stores: the "
            f"{owner} store's runs finish on the {owner} store."
        )
    if partitions is not None and recorded != partitions:
        raise ConfigError(
            f"the {prefix}.commands and {prefix}.events topics have {partitions} "
            f"partitions, but runs were placed on {recorded}: a run's partition is "
            "murmur2(run id) mod the count, so runs would move and their commands "
            "and events split. Go back to the recorded count, or start new runs "
            "under a new ES_AGENTS_TOPIC_PREFIX with the count you want."
        )


def default_prefix(store: str) -> str:
    return POSTGRES_PREFIX if store == "postgres" else KAFKA_PREFIX
