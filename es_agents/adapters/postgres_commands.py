"""What became of each command, and which agents are served: Postgres tables
``commands`` and ``agents`` (``projectors/sql/0004_*``).

The client records a command as ``sent`` before producing it; the worker that owns
the run's partition records its verdict (``applied`` once the command's events are
durable, ``refused`` with the reason). ``applied`` is final: a verdict written later
for the same command id (a redelivery after a rebalance) never overrides it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any, final

import psycopg

from es_agents.adapters.postgres import Database
from es_agents.core.commands import Command, ForkRun, StartRun
from es_agents.errors import Unavailable
from es_agents.ports import Decided, ServedAgent, ServingWorker, Verdict

_COLUMNS = "command_id, run_id, type, status, reason, agent, sent_at, decided_at"


def _verdict(row: tuple[object, ...]) -> Verdict:
    return Verdict(*row)  # type: ignore[arg-type]


CHANNEL = "es_verdicts"


class Verdicts:
    """One connection LISTENing on ``es_verdicts`` in a daemon thread, waking the
    threads that wait for a command id the worker just decided, with its verdict
    when the notification carried it."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._waiting: dict[str, threading.Event] = {}
        self._arrived: dict[str, Verdict] = {}
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(
            target=self._listen, daemon=True, name="es-verdicts"
        )
        self._thread.start()

    def register(self, command_id: str) -> threading.Event:
        with self._lock:
            return self._waiting.setdefault(command_id, threading.Event())

    def arrived(self, command_id: str) -> Verdict | None:
        """The verdict a notification carried for ``command_id``, if one did."""
        with self._lock:
            return self._arrived.get(command_id)

    def unregister(self, command_id: str) -> None:
        with self._lock:
            self._waiting.pop(command_id, None)
            self._arrived.pop(command_id, None)

    def _listen(self) -> None:
        while not self._closed.is_set():
            try:
                with psycopg.connect(
                    self._url, autocommit=True, connect_timeout=5
                ) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    while not self._closed.is_set():
                        for note in conn.notifies(timeout=0.5):
                            self._wake(note.payload)
            except psycopg.Error:
                self._closed.wait(1.0)  # waiters look every 0.25 s meanwhile

    def _wake(self, payload: str) -> None:
        """``payload``: the decided rows as JSON, or their command ids only."""
        try:
            items = json.loads(payload)
        except ValueError:
            items = payload.split(",")  # a worker of an earlier version: ids
        with self._lock:
            for item in items if isinstance(items, list) else ():
                row = item if isinstance(item, dict) else {"command_id": item}
                event = self._waiting.get(str(row.get("command_id")))
                if event is None:
                    continue
                if "status" in row:
                    self._arrived[row["command_id"]] = _from_json(row)
                event.set()

    def close(self) -> None:
        self._closed.set()


def _from_json(row: dict[str, Any]) -> Verdict:
    """A ``commands`` row as ``json_agg`` wrote it (times as ISO-8601 text)."""
    times = {
        k: None if row[k] is None else datetime.fromisoformat(row[k])
        for k in ("sent_at", "decided_at")
    }
    return Verdict(**{**row, **times})


def _once_each(verdicts: Sequence[Decided]) -> list[Decided]:
    """One verdict per command: one delivered twice (re-sent with its id, or
    redelivered) may be decided twice in one batch, and one upsert cannot touch a
    row twice. An applied verdict wins, as it does against a later one in the table."""
    kept: dict[str, Decided] = {}
    for v in verdicts:
        seen = kept.get(v.command.command_id)
        if seen is None or seen.status != "applied":
            kept[v.command.command_id] = v
    return list(kept.values())


@final
class PostgresCommandBook:
    """Scoped to one topic prefix: several deployments may share a database."""

    def __init__(self, db: Database, prefix: str) -> None:
        self._db = db
        self._prefix = prefix
        self._lock = threading.Lock()
        self._verdicts: Verdicts | None = None

    # -- the worker's side -------------------------------------------------------------
    def decided(self, verdicts: Sequence[Decided]) -> None:
        """Record the verdicts and wake their senders in one statement per 100: the
        notification carries the rows (the senders need not ask), or only their
        ids when the rows would not fit in a payload (8,000 bytes)."""
        verdicts = _once_each(verdicts)
        for i in range(0, len(verdicts), 100):
            chunk = verdicts[i : i + 100]
            params: list[object] = []
            for v in chunk:
                c = v.command
                agent = c.agent if isinstance(c, StartRun | ForkRun) else None
                params += [c.command_id, self._prefix, c.run_id, c.wire_name]
                params += [agent, v.status, v.reason]
            values = ", ".join(["(%s, %s, %s, %s, %s, %s, %s, now())"] * len(chunk))
            with self._db.statement() as conn:
                conn.execute(
                    "WITH decided AS (INSERT INTO commands (command_id, prefix, "  # noqa: S608
                    "run_id, type, agent, status, reason, decided_at) VALUES "
                    f"{values} ON CONFLICT (command_id) DO UPDATE SET "
                    "status = EXCLUDED.status, reason = EXCLUDED.reason, "
                    "decided_at = EXCLUDED.decided_at "
                    f"WHERE commands.status <> 'applied' RETURNING {_COLUMNS}), "
                    "payload AS (SELECT json_agg(decided)::text AS rows, "
                    "json_agg(decided.command_id)::text AS ids FROM decided) "
                    "SELECT pg_notify(%s, CASE WHEN octet_length(rows) < 7900 "
                    "THEN rows ELSE ids END) FROM payload WHERE ids IS NOT NULL",
                    [*params, CHANNEL],
                )

    def serve(  # noqa: PLR0917 - one row's columns
        self,
        worker_id: str,
        agent: str,
        agent_version: str,
        gates: Sequence[str] | None,
        tools: Sequence[str],
        group_id: str,
        encrypted: bool = False,
    ) -> None:
        """Say (again) that a worker serves ``agent``: a heartbeat."""
        with self._db.transaction() as conn:
            conn.execute(
                "INSERT INTO agents (prefix, agent, worker_id, agent_version, gates, "
                "tools, group_id, encrypted, seen_at) VALUES (%s, %s, %s, %s, %s, %s, "
                "%s, %s, now()) ON CONFLICT (prefix, agent, worker_id) "
                "DO UPDATE SET agent_version = EXCLUDED.agent_version, gates = "
                "EXCLUDED.gates, tools = EXCLUDED.tools, group_id = EXCLUDED.group_id,"
                " encrypted = EXCLUDED.encrypted, seen_at = now()",
                (
                    self._prefix,
                    agent,
                    worker_id,
                    agent_version,
                    None if gates is None else json.dumps(sorted(gates)),
                    json.dumps(sorted(tools)),
                    group_id,
                    encrypted,
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
        with self._db.statement() as conn:  # one statement: one round trip
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

    def wait_verdict(self, command_id: str, timeout: float) -> Verdict | None:
        """Woken by the worker's NOTIFY (``verdicts`` below); a look every 0.25 s
        besides, so a lost notification (a reconnect) costs at most that."""
        deadline = time.monotonic() + timeout
        waiting = self._listener()
        woken = waiting.register(command_id)
        try:
            while True:
                woken.clear()  # before the look: a wake-up after it is kept
                found = waiting.arrived(command_id) or self.verdict(command_id)
                if found is not None and found.status != "sent":
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                woken.wait(min(left, 0.25))
        finally:
            waiting.unregister(command_id)

    def _listener(self) -> Verdicts:
        with self._lock:
            if self._verdicts is None:
                self._verdicts = Verdicts(self._db.url)
            return self._verdicts

    def close(self) -> None:
        with self._lock:
            if self._verdicts is not None:
                self._verdicts.close()
                self._verdicts = None

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

    def workers(self) -> list[ServingWorker]:
        with self._db.transaction() as conn:
            rows = conn.execute(
                "SELECT agent, worker_id, agent_version, tools, gates, seen_at, "
                "extract(epoch FROM now() - seen_at), stopped_at IS NOT NULL "
                "FROM agents WHERE prefix = %s ORDER BY agent, seen_at DESC",
                (self._prefix,),
            ).fetchall()
        return [
            ServingWorker(
                agent,
                worker_id,
                version,
                list(tools),
                gates,
                seen_at,
                float(age),
                bool(stopped),
            )
            for agent, worker_id, version, tools, gates, seen_at, age, stopped in rows
        ]

    def agent(self, name: str) -> ServedAgent | None:
        with self._db.transaction() as conn:
            row = conn.execute(
                "SELECT agent, agent_version, gates, tools, group_id, seen_at, "
                "extract(epoch FROM now() - seen_at), stopped_at IS NOT NULL, "
                "encrypted FROM agents WHERE prefix = %s AND agent = %s "
                "ORDER BY stopped_at IS NULL DESC, seen_at DESC LIMIT 1",
                (self._prefix, name),
            ).fetchone()
        if row is None:
            return None
        agent, version, gates, tools, group_id, seen_at, age, stopped, encrypted = row
        return ServedAgent(
            agent,
            version,
            gates,
            list(tools),
            group_id,
            seen_at,
            float(age),
            bool(stopped),
            bool(encrypted),
        )
