"""What became of each command, and which agents are served: Postgres tables
``commands`` and ``agents`` (``projectors/sql/0004_*``).

The client records a command as ``sent`` before producing it; the worker that owns
the run's partition records its verdict (``applied`` once the command's events are
durable, ``refused`` with the reason). ``applied`` is final: a verdict written later
for the same command id (a redelivery after a rebalance) never overrides it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import final

import psycopg

from es_agents.adapters.postgres import Database
from es_agents.core.commands import Command, ForkRun, StartRun
from es_agents.errors import Unavailable
from es_agents.ports import Decided, ServedAgent, Verdict

_COLUMNS = "command_id, run_id, type, status, reason, agent, sent_at, decided_at"


def _verdict(row: tuple[object, ...]) -> Verdict:
    return Verdict(*row)  # type: ignore[arg-type]


@final
class PostgresCommandBook:
    """Scoped to one topic prefix: several deployments may share a database."""

    def __init__(self, db: Database, prefix: str) -> None:
        self._db = db
        self._prefix = prefix

    # -- the worker's side -------------------------------------------------------------
    def decided(self, verdicts: Sequence[Decided]) -> None:
        if not verdicts:
            return
        rows = [
            (
                v.command.command_id,
                self._prefix,
                v.command.run_id,
                v.command.wire_name,
                v.command.agent if isinstance(v.command, StartRun | ForkRun) else None,
                v.status,
                v.reason,
            )
            for v in verdicts
        ]
        with self._db.transaction() as conn, conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO commands (command_id, prefix, run_id, type, agent, "
                "status, reason, decided_at) VALUES (%s, %s, %s, %s, %s, %s, %s, "
                "now()) "
                "ON CONFLICT (command_id) DO UPDATE SET status = EXCLUDED.status, "
                "reason = EXCLUDED.reason, decided_at = EXCLUDED.decided_at "
                "WHERE commands.status <> 'applied'",
                rows,
            )

    def serve(  # noqa: PLR0917 - one row's columns
        self,
        worker_id: str,
        agent: str,
        agent_version: str,
        gates: Sequence[str] | None,
        tools: Sequence[str],
        group_id: str,
    ) -> None:
        """Say (again) that a worker serves ``agent``: a heartbeat."""
        with self._db.transaction() as conn:
            conn.execute(
                "INSERT INTO agents (prefix, agent, worker_id, agent_version, gates, "
                "tools, group_id, seen_at) VALUES (%s, %s, %s, %s, %s, %s, %s, now()) "
                "ON CONFLICT (prefix, agent, worker_id) "
                "DO UPDATE SET agent_version = EXCLUDED.agent_version, gates = "
                "EXCLUDED.gates, tools = EXCLUDED.tools, group_id = EXCLUDED.group_id,"
                " seen_at = now()",
                (
                    self._prefix,
                    agent,
                    worker_id,
                    agent_version,
                    None if gates is None else json.dumps(sorted(gates)),
                    json.dumps(sorted(tools)),
                    group_id,
                ),
            )

    def retire(self, worker_id: str, agent: str) -> None:
        """A worker that stops says so: clients stop waiting for its verdicts.
        Rows of workers stopped a day ago go."""
        with self._db.transaction() as conn:
            conn.execute(
                "UPDATE agents SET stopped_at = now() WHERE prefix = %s "
                "AND agent = %s AND worker_id = %s",
                (self._prefix, agent, worker_id),
            )
            conn.execute(
                "DELETE FROM agents WHERE prefix = %s AND agent = %s "
                "AND seen_at < now() - interval '1 day'",
                (self._prefix, agent),
            )

    # -- the client's side -------------------------------------------------------------
    def reserve_start(
        self, command: StartRun | ForkRun, run_exists: bool
    ) -> str | None:
        """Record a start as sent unless its run id is taken; return why it is taken.

        A transaction-scoped advisory lock on the run id makes two concurrent starts
        of the same id see each other.
        """
        try:
            with self._db.transaction() as conn:
                conn.execute(
                    "SELECT pg_advisory_xact_lock(hashtextextended(%s, 7))",
                    (f"{self._prefix}/{command.run_id}",),
                )
                row = conn.execute(
                    f"SELECT {_COLUMNS} FROM commands WHERE prefix = %s "  # noqa: S608
                    "AND run_id = %s AND type IN ('start_run', 'fork_run') "
                    "AND status <> 'refused' "
                    "ORDER BY sent_at NULLS LAST LIMIT 1",
                    (self._prefix, command.run_id),
                ).fetchone()
                if row is not None:
                    earlier = _verdict(row)
                    if earlier.command_id == command.command_id:
                        return None  # the same command sent again
                    if earlier.status == "sent":
                        return (
                            f"run {command.run_id} is already pending (a start "
                            f"for agent {earlier.agent!r} waits for a worker)"
                        )
                    return f"run {command.run_id} already exists"
                if run_exists:
                    return f"run {command.run_id} already exists"
                self._insert_sent(conn, command)
        except psycopg.Error as e:
            raise Unavailable(f"postgres: {e}") from e
        return None

    def sent(self, command: Command) -> None:
        with self._db.transaction() as conn:
            self._insert_sent(conn, command)

    def _insert_sent(
        self, conn: psycopg.Connection[tuple[object, ...]], c: Command
    ) -> None:
        conn.execute(
            "INSERT INTO commands (command_id, prefix, run_id, type, agent, status, "
            "sent_at) VALUES (%s, %s, %s, %s, %s, 'sent', now()) "
            "ON CONFLICT (command_id) DO NOTHING",
            (
                c.command_id,
                self._prefix,
                c.run_id,
                c.wire_name,
                c.agent if isinstance(c, StartRun | ForkRun) else None,
            ),
        )

    def verdict(self, command_id: str) -> Verdict | None:
        with self._db.transaction() as conn:
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM commands WHERE command_id = %s",  # noqa: S608
                (command_id,),
            ).fetchone()
        return None if row is None else _verdict(row)

    def for_run(self, run_id: str) -> list[Verdict]:
        with self._db.transaction() as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM commands WHERE prefix = %s "  # noqa: S608
                "AND run_id = %s ORDER BY coalesce(sent_at, decided_at)",
                (self._prefix, run_id),
            ).fetchall()
        return [_verdict(r) for r in rows]

    def agent(self, name: str) -> ServedAgent | None:
        with self._db.transaction() as conn:
            row = conn.execute(
                "SELECT agent, agent_version, gates, tools, group_id, seen_at, "
                "extract(epoch FROM now() - seen_at), stopped_at IS NOT NULL "
                "FROM agents WHERE prefix = %s AND agent = %s "
                "ORDER BY stopped_at IS NULL DESC, seen_at DESC LIMIT 1",
                (self._prefix, name),
            ).fetchone()
        if row is None:
            return None
        agent, version, gates, tools, group_id, seen_at, age, stopped = row
        return ServedAgent(
            agent,
            version,
            gates,
            list(tools),
            group_id,
            seen_at,
            float(age),
            bool(stopped),
        )
