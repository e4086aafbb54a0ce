"""The projector: the events topic into ``runs``, ``run_events``, ``run_tails`` and
``run_snapshots``.

A consumer group on the events topic (read_committed on Kafka), on any store.
Each batch is written in one
Postgres transaction together with the consumed offsets (``projector_offsets``), and
messages below the stored offset are skipped, so a projector killed at any point and
restarted ends with the same tables as one that never crashed. Claims and the writes
of fenced workers are left out (``es_agents.core.epochs``); the partition's epoch
floors are stored with its offset. A batch's events and runs go in with one
statement each (columns as arrays, unnested), the rest with pipelined
``executemany``. A snapshot holds a run's state without its transcript, which goes to
``run_transcripts`` in append-only chunks; only a run's latest snapshot is kept.
``run_events`` says where each event is in the log; the bytes of what a resume
folds -- the events from the run's latest snapshot on -- are kept in ``run_tails``,
whose rows below a new snapshot go in the snapshot's transaction.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from es_agents.adapters.postgres import Database
from es_agents.adapters.postgres_projections import fold_verified, load_projected
from es_agents.archive import claimed_keys
from es_agents.core.authorship import (
    AUTH_HEADER,
    Authenticator,
    chunk_bytes,
    describe,
    mac_of,
    snapshot_bytes,
    worth_a_line,
)
from es_agents.core.chain import digest
from es_agents.core.epochs import EPOCH_HEADER, EpochFence
from es_agents.core.events import (
    Event,
    Interrupted,
    Resumed,
    RunCompleted,
    RunFailed,
)
from es_agents.core.fold import fold
from es_agents.core.reducer import reducer_version
from es_agents.core.run_row import RUN_COLUMNS, run_row
from es_agents.core.snapshot import to_snapshot, transcript_chunks
from es_agents.core.state import RunState
from es_agents.core.transcript import CHUNK
from es_agents.dead_letters import DeadLetterQueue
from es_agents.errors import (
    ConfigError,
    DecodeError,
    FoldError,
    PayloadUnavailable,
    ProjectionIncomplete,
    ProjectionUntrusted,
)
from es_agents.history import read_projected
from es_agents.observability import NoTelemetry, Telemetry
from es_agents.ports import EventLog, Probe, Received, Record, Subscribe
from es_agents.settings import Settings

log = logging.getLogger(__name__)

SNAPSHOT_EVENTS = (Interrupted, RunCompleted, RunFailed)
# ``run_tails`` is vacuumed once this many rows went, at most this often.
TAILS_VACUUM_ROWS = 200
TAILS_VACUUM_SECONDS = 1.0


@dataclass
class Batch:
    events: list[tuple[Any, ...]] = field(default_factory=list)
    tails: list[tuple[Any, ...]] = field(default_factory=list)  # bytes, MAC
    tails_deleted: int = 0  # run_tails rows below the batch's new snapshots
    snapshots: list[tuple[Any, ...]] = field(default_factory=list)
    chunks: list[tuple[Any, ...]] = field(default_factory=list)
    latest: dict[str, int] = field(default_factory=dict)  # run -> newest snapshot
    runs: dict[str, tuple[RunState, int, int, str]] = field(default_factory=dict)
    offsets: dict[int, int] = field(default_factory=dict)
    floors: dict[int, dict[str, int]] = field(default_factory=dict)
    dead: list[tuple[Any, ...]] = field(default_factory=list)
    waits: list[tuple[str, float]] = field(default_factory=list)  # agent, seconds
    refs: list[tuple[str, str]] = field(default_factory=list)  # payload key, run


def _auth_value(headers: Sequence[tuple[str, bytes]]) -> str | None:
    """The record's writer MAC, as ``run_tails.mac`` keeps it."""
    for name, value in headers:
        if name == AUTH_HEADER:
            return value.decode()
    return None


def load_state(
    conn: psycopg.Connection[Any],
    decode: Callable[[bytes], Event],
    run_id: str,
    restore: Callable[[Event], Event] | None = None,
    auth: Authenticator | None = None,
) -> RunState | None:
    """A run's state from the projection alone: snapshot + projected events
    (verified against the writer key, when given)."""
    return load_projected(conn, decode, run_id, restore, auth=auth)[0]


class Projector:
    def __init__(
        self,
        settings: Settings,
        db: Database,
        log: EventLog,
        subscribe: Subscribe,
        *,
        probe: Probe,
        closers: Sequence[Callable[[], None]] = (),
        batch_size: int = 2000,
        cache_size: int = 10_000,
        instance_id: str | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.settings = settings
        self.telemetry = telemetry if telemetry is not None else NoTelemetry()
        self._counted_at = 0.0  # when runs by status were last counted
        self._tails_deleted = 0  # run_tails rows deleted since its last VACUUM
        self._tails_vacuumed = time.monotonic()
        self.k = settings.snapshot_every
        self.group_id = settings.projector_group_id
        self.topic = settings.kafka.events_topic
        self.batch_size = batch_size
        self.log = log
        self.probe = probe
        self._closers = list(closers)
        self.db = db
        self.db.migrate()
        self.dlq = DeadLetterQueue(log, settings.kafka.dlq_topic, self.telemetry)
        self._cache: OrderedDict[str, RunState] = OrderedDict()
        # Per run: how many transcript messages its stored chunks hold (as far as
        # this projector knows; read from the table on a miss).
        self._stored: dict[str, int] = {}
        # Runs folded without some claim-checked payload: no snapshots of them.
        self._incomplete: set[str] = set()
        self.restore: Callable[[Event], Event] = log.restore
        self._cache_size = cache_size
        self._stop = threading.Event()
        self.projected = 0
        self.fenced_writes = 0  # events of fenced workers left out
        self.forged_writes = 0  # records without a worker's MAC left out
        # Milliseconds from each event's creation to the commit that projected it.
        self.lags_ms: list[float] = []
        self.source = subscribe(
            self.topic,
            self.group_id,
            bytes,
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            instance_id=instance_id,
            gather_ms=settings.projector_gather_ms,
        )

    def reset(self) -> None:
        """Empty the projections and this group's offsets: the next assignment
        projects every partition from its start. Run with no other projector up.
        Refused (``ConfigError``) when the database also holds another prefix's
        projections: the tables are shared, so theirs would be emptied too while
        their projectors went on past the start."""
        with self.db.transaction() as conn:
            others = conn.execute(
                "SELECT DISTINCT topic FROM projector_offsets "
                "WHERE NOT (group_id = %s AND topic = %s) ORDER BY topic",
                (self.group_id, self.topic),
            ).fetchall()
            if others:
                raise ConfigError(
                    f"this database also holds the projections of "
                    f"{', '.join(str(t) for (t,) in others)}: --rebuild empties "
                    "every prefix's rows, and their projectors would not project "
                    "them again. Rebuild a prefix that has a database of its own"
                )
            conn.execute(
                "TRUNCATE runs, run_events, run_tails, run_snapshots, "
                "run_transcripts, dead_letters"
            )
            conn.execute(
                "DELETE FROM projector_offsets WHERE group_id = %s AND topic = %s",
                (self.group_id, self.topic),
            )
        self._cache.clear()
        self._stored.clear()

    # -- partitions --------------------------------------------------------------
    def _on_assign(self, partitions: list[int]) -> dict[int, int]:
        """Start each partition where the last committed transaction left it."""
        with self.db.transaction() as conn:
            stored = dict(
                conn.execute(
                    "SELECT partition, next_offset FROM projector_offsets "
                    "WHERE group_id = %s AND topic = %s",
                    (self.group_id, self.topic),
                ).fetchall()
            )
        self._cache.clear()
        self._stored.clear()
        starts = {p: int(stored.get(p, 0)) for p in partitions}
        log.info("projecting partitions %s from %s", partitions, starts)
        return starts

    def _on_revoke(self, partitions: list[int]) -> None:
        self._cache.clear()
        self._stored.clear()

    # -- the loop ------------------------------------------------------------------
    def run(self, until_caught_up: bool = False, idle_seconds: float = 0.5) -> None:
        last_message = time.monotonic()
        try:
            while not self._stop.is_set():
                received = self.source.poll(timeout=0.1, max_messages=self.batch_size)
                if received:
                    last_message = time.monotonic()
                    self.apply([_record(r, self.topic) for r in received])
                self._count_runs()
                if (
                    until_caught_up
                    and self.source.caught_up()
                    and time.monotonic() - last_message > idle_seconds
                ):
                    return
        finally:
            self.close()

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self.source.close()
        self.db.close()
        for close in self._closers:
            close()

    def apply(self, msgs: list[Record]) -> None:
        """Project one batch in one transaction, offsets included; all or nothing."""
        try:
            with self.db.transaction() as conn:
                batch = self._build(conn, msgs)
                self._write(conn, batch)
                self.probe.hit("projector:before_commit")
        except BaseException:
            self._cache.clear()  # it may hold folds of what was not committed
            self._stored.clear()
            raise
        self.probe.hit("projector:after_commit")
        self.projected += len(batch.events)
        now = datetime.now(UTC)
        self.lags_ms.extend((now - e[4]).total_seconds() * 1000 for e in batch.events)
        self._report(batch, now)
        self._vacuum_tails(batch.tails_deleted)

    def _vacuum_tails(self, deleted: int) -> None:
        """``run_tails`` is a queue: rows in, and out at each snapshot. Its space is
        reused only once a VACUUM marked it free, and autovacuum may wait a
        minute; so the projector vacuums it when enough rows went, keeping the
        table near its live rows, whatever the runs' length. (A role that does not
        own the table gets a warning and leaves it to autovacuum.)"""
        self._tails_deleted += deleted
        if (
            self._tails_deleted < TAILS_VACUUM_ROWS
            or time.monotonic() - self._tails_vacuumed < TAILS_VACUUM_SECONDS
        ):
            return
        self._tails_deleted = 0
        self._tails_vacuumed = time.monotonic()
        try:
            with self.db.statement() as conn:
                conn.execute("VACUUM run_tails")
        except psycopg.Error as e:  # housekeeping: the next batch tries again
            log.warning("VACUUM run_tails: %s", e)

    def _report(self, batch: Batch, now: datetime) -> None:
        """Metrics of a committed batch."""
        if isinstance(self.telemetry, NoTelemetry):
            return
        lag = (now - batch.events[-1][4]).total_seconds() if batch.events else 0.0
        self.telemetry.projected([e[3] for e in batch.events], lag)
        for agent, seconds in batch.waits:
            self.telemetry.approval_waited(agent, seconds)

    def _count_runs(self) -> None:
        """Runs by status for the metrics, at most every 5 s."""
        if isinstance(self.telemetry, NoTelemetry):
            return
        if time.monotonic() - self._counted_at < 5:
            return
        self._counted_at = time.monotonic()
        with self.db.transaction() as conn:
            rows = conn.execute(
                "SELECT status, count(*) FROM runs GROUP BY status"
            ).fetchall()
        self.telemetry.runs_by_status({str(s): int(n) for s, n in rows})

    def _build(self, conn: psycopg.Connection[Any], msgs: list[Record]) -> Batch:
        batch = Batch()
        by_partition: dict[int, list[Record]] = {}
        for msg in msgs:
            by_partition.setdefault(msg.partition, []).append(msg)
        for partition, part in by_partition.items():
            row = conn.execute(
                "SELECT next_offset, floors FROM projector_offsets WHERE group_id = %s "
                "AND topic = %s AND partition = %s FOR UPDATE",
                (self.group_id, self.topic, partition),
            ).fetchone()
            stored = row[0] if row is not None else 0
            fence = EpochFence(row[1] if row is not None else None, self.log.auth)
            for msg in part:
                offset = msg.offset
                if offset < stored:
                    continue  # projected by an earlier transaction
                ignored, forged = fence.ignored, fence.forged
                if fence.admits(msg.headers, msg.value):
                    self._project(conn, batch, msg, partition, offset)
                elif fence.forged > forged:  # not written by a worker
                    self.forged_writes += 1
                    if worth_a_line(self.forged_writes):
                        log.warning(
                            "%s[%d]@%d: left out: %s (key %s): not written by a "
                            "worker (%d so far)",
                            self.topic,
                            partition,
                            offset,
                            describe(msg.headers),
                            msg.key,
                            self.forged_writes,
                        )
                elif fence.ignored > ignored:  # a zombie's event, not a claim
                    self.fenced_writes += 1
                    log.warning(
                        "%s[%d]@%d: left out: written by a fenced worker (%s)",
                        self.topic,
                        partition,
                        offset,
                        dict(msg.headers).get(EPOCH_HEADER, b"").decode(),
                    )
                batch.offsets[partition] = offset + 1
            batch.floors[partition] = fence.floors
        return batch

    def _project(
        self,
        conn: psycopg.Connection[Any],
        batch: Batch,
        msg: Record,
        partition: int,
        offset: int,
    ) -> None:
        payload = msg.value
        try:
            event = self.log.decode_event(payload)
        except DecodeError as e:
            self._dead(batch, msg, f"undecodable event: {e}")
            return
        try:
            state = self._state(conn, event.run_id)
        except ProjectionUntrusted as e:  # rows changed by someone without the key
            self._dead(batch, msg, f"not projected: {e}")
            return
        if state is not None and event.seq <= state.seq:
            return  # a duplicate of a projected event
        batch.refs += [(key, event.run_id) for key in claimed_keys(event)]
        event = self._restore(event)
        if (
            isinstance(event, Resumed)
            and event.by is not None  # a person's decision: the wait since the pause
            and state is not None
            and state.updated_at is not None
        ):
            wait = (event.at - state.updated_at).total_seconds()
            batch.waits.append((state.agent, max(wait, 0.0)))
        try:
            state = fold(
                state if state is not None else RunState(run_id=event.run_id), event
            )
        except FoldError as e:
            self._cache.pop(event.run_id, None)  # the fold may have half-changed it
            self._dead(batch, msg, f"event does not fold: {e}")
            return
        self._remember(state)
        batch.events.append(
            (
                event.run_id,
                event.seq,
                event.step,
                event.wire_name,
                event.at,
                partition,
                offset,
            )
        )
        batch.tails.append((event.run_id, event.seq, payload, _auth_value(msg.headers)))
        head = digest(payload)
        batch.runs[event.run_id] = (state, partition, offset, head.hex())
        snapshot = (event.seq + 1) % self.k == 0 or isinstance(event, SNAPSHOT_EVENTS)
        if snapshot and event.run_id not in self._incomplete:
            self._snapshot(conn, batch, state, (partition, offset), head)

    def _snapshot(
        self,
        conn: psycopg.Connection[Any],
        batch: Batch,
        state: RunState,
        at: tuple[int, int],  # partition, offset
        head: bytes,
    ) -> None:
        """The state without its transcript, and the transcript's chunks from the
        last one stored (rewritten while it fills up); older snapshots go. Signed
        with the writer key: a worker resumes from it only if it verifies."""
        run_id = state.run_id
        stored = self._stored.get(run_id)
        if stored is None:
            row = conn.execute(
                "SELECT coalesce(max(chunk), -1) FROM run_transcripts "
                "WHERE run_id = %s",
                (run_id,),
            ).fetchone()
            stored = max(int(row[0]) if row else -1, 0) * CHUNK
        auth = self.log.auth
        for chunk, messages in transcript_chunks(state.transcript, stored):
            chunk_mac = None
            if auth is not None:  # over the messages as the JSON column gives back
                signed = chunk_bytes(run_id, chunk, json.loads(json.dumps(messages)))
                chunk_mac = mac_of(auth.header(signed))
            batch.chunks.append((run_id, chunk, Jsonb(messages), chunk_mac))
        self._stored[run_id] = len(state.transcript)
        text = json.dumps(to_snapshot(state, inline=False))
        mac = None
        if auth is not None:  # over the state as the JSON column gives it back
            signed = snapshot_bytes(run_id, state.seq, head, json.loads(text))
            mac = mac_of(auth.header(signed))
        batch.snapshots.append((run_id, state.seq, reducer_version(), *at, text, mac))
        batch.latest[run_id] = state.seq

    def _dead(self, batch: Batch, msg: Record, reason: str) -> None:
        """To the DLQ (durable before the batch commits) and to ``dead_letters`` in
        the batch's transaction, so the run shows it; the projector goes on."""
        topic, partition, offset = msg.topic, msg.partition, msg.offset
        log.error("%s[%d]@%d: not projected: %s", topic, partition, offset, reason)
        self.dlq.send(msg, reason)
        batch.dead.append((topic, partition, offset, msg.key, reason))

    def _state(self, conn: psycopg.Connection[Any], run_id: str) -> RunState | None:
        state = self._cache.get(run_id)
        if state is not None:
            self._cache.move_to_end(run_id)
            return state
        self._incomplete.discard(run_id)
        try:
            return self._load(conn, run_id, self.restore)
        except PayloadUnavailable as e:
            log.warning("run %s: projected without its payloads: %s", run_id, e)
            self._incomplete.add(run_id)
            return self._load(conn, run_id, None)

    def _load(
        self,
        conn: psycopg.Connection[Any],
        run_id: str,
        restore: Callable[[Event], Event] | None,
    ) -> RunState | None:
        """Snapshot and tail; without a snapshot to start from, the run's
        projected events read from the log (verified and chained likewise)."""
        auth = self.log.auth
        try:
            return load_state(conn, self.log.decode_event, run_id, restore, auth)
        except ProjectionIncomplete as e:
            log.info("%s: its projected events are read from the log", e)
        where = {
            int(offset): int(seq)
            for offset, seq in conn.execute(
                'SELECT "offset", seq FROM run_events WHERE run_id = %s', (run_id,)
            )
        }
        written = read_projected(self.log, self.topic, run_id, where)
        state, _ = fold_verified(
            [(w.value, w.mac) for w in written],
            self.log.decode_event,
            run_id,
            restore,
            auth,
        )
        return state

    def _restore(self, event: Event) -> Event:
        """The event with its claim-checked payloads; without them (and no more
        snapshots of its run until it loads whole again) when they are unavailable:
        a snapshot must be the fold of the log, never of empty fields."""
        try:
            return self.restore(event)
        except PayloadUnavailable as e:
            log.warning("%s", e)
            self._incomplete.add(event.run_id)
            return event

    def _remember(self, state: RunState) -> None:
        self._cache[state.run_id] = state
        self._cache.move_to_end(state.run_id)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    def _write(self, conn: psycopg.Connection[Any], batch: Batch) -> None:
        with conn.cursor() as cur:
            if batch.events or batch.runs:
                cur.execute(_STAGING)
            if batch.events:  # copied in, then one statement for the batch
                _copy(cur, "stage_events", _EVENT_COLUMNS, batch.events)
                cur.execute(_INSERT_EVENTS)
                _copy(cur, "stage_tails", _TAIL_COLUMNS, batch.tails)
                cur.execute(_INSERT_TAILS)
            if batch.chunks:
                cur.executemany(
                    "INSERT INTO run_transcripts (run_id, chunk, messages, mac) "
                    "VALUES (%s, %s, %s, %s) ON CONFLICT (run_id, chunk) "
                    "DO UPDATE SET messages = EXCLUDED.messages, mac = EXCLUDED.mac",
                    batch.chunks,
                )
            if batch.snapshots:
                cur.executemany(
                    "INSERT INTO run_snapshots (run_id, seq, reducer_version, "
                    'partition, "offset", state, mac) VALUES (%s, %s, %s, %s, %s, '
                    "%s, %s) ON CONFLICT DO NOTHING",
                    batch.snapshots,
                )
                # Only the latest snapshot of a run is ever read (O(K) resume),
                # with the tail from its event on.
                latest = _columns(list(batch.latest.items()), 2)
                cur.execute(
                    "DELETE FROM run_snapshots s USING unnest(%s::text[], "
                    "%s::bigint[]) AS l(run_id, seq) "
                    "WHERE s.run_id = l.run_id AND s.seq < l.seq",
                    latest,
                )
                cur.execute(
                    "DELETE FROM run_tails t USING unnest(%s::text[], "
                    "%s::bigint[]) AS l(run_id, seq) "
                    "WHERE t.run_id = l.run_id AND t.seq < l.seq",
                    latest,
                )
                batch.tails_deleted = max(cur.rowcount, 0)
            if batch.refs:
                cur.execute(
                    "INSERT INTO payload_refs (key, run_id) SELECT * FROM "
                    "unnest(%s::text[], %s::text[]) ON CONFLICT DO NOTHING",
                    _columns(batch.refs, 2),
                )
            if batch.dead:
                cur.executemany(
                    'INSERT INTO dead_letters (topic, partition, "offset", run_id, '
                    "reason) VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                    batch.dead,
                )
            if batch.runs:
                rows = [_run_row(*run) for run in batch.runs.values()]
                _copy(cur, "stage_runs", _COLUMNS, rows)
                cur.execute(_UPSERT_RUNS)
            cur.executemany(
                "INSERT INTO projector_offsets "
                "(group_id, topic, partition, next_offset, floors) "
                "VALUES (%s, %s, %s, %s, %s) "
                "ON CONFLICT (group_id, topic, partition) "
                "DO UPDATE SET next_offset = EXCLUDED.next_offset, "
                "floors = EXCLUDED.floors",
                [
                    (self.group_id, self.topic, p, o, Jsonb(batch.floors[p]))
                    for p, o in batch.offsets.items()
                ],
            )


# A batch's events and runs are copied (COPY, whose rows psycopg formats in C) into
# tables of the session that empty at commit, then go into their tables in one
# statement each. Binding them as arrays instead cost the projector three times the
# CPU: psycopg dumps array parameters in Python, element by element.
_EVENT_COLUMNS = (
    "run_id",
    "seq",
    "step",
    "type",
    "at",
    "partition",
    '"offset"',
)
_TAIL_COLUMNS = ("run_id", "seq", "payload", "mac")
_COLUMNS = (*RUN_COLUMNS, "partition", "last_offset", "head")
_STAGING = (
    "CREATE TEMP TABLE IF NOT EXISTS stage_events "
    "(LIKE run_events INCLUDING DEFAULTS) ON COMMIT DELETE ROWS; "
    "CREATE TEMP TABLE IF NOT EXISTS stage_tails "
    "(LIKE run_tails INCLUDING DEFAULTS) ON COMMIT DELETE ROWS; "
    "CREATE TEMP TABLE IF NOT EXISTS stage_runs "
    "(LIKE runs INCLUDING DEFAULTS) ON COMMIT DELETE ROWS"
)
_INSERT_EVENTS = (
    f"INSERT INTO run_events ({', '.join(_EVENT_COLUMNS)}) "  # noqa: S608 - fixed
    f"SELECT {', '.join(_EVENT_COLUMNS)} FROM stage_events ON CONFLICT DO NOTHING"
)
_INSERT_TAILS = (
    f"INSERT INTO run_tails ({', '.join(_TAIL_COLUMNS)}) "  # noqa: S608 - fixed
    f"SELECT {', '.join(_TAIL_COLUMNS)} FROM stage_tails ON CONFLICT DO NOTHING"
)
_UPSERT_RUNS = (
    f"INSERT INTO runs ({', '.join(_COLUMNS)}) "  # noqa: S608 - fixed column names
    f"SELECT {', '.join(_COLUMNS)} FROM stage_runs "
    "ON CONFLICT (run_id) DO UPDATE SET "
    + ", ".join(f"{c} = EXCLUDED.{c}" for c in _COLUMNS[1:])
    + " WHERE runs.last_seq < EXCLUDED.last_seq"
)


def _copy(
    cur: psycopg.Cursor[Any],
    table: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
) -> None:
    with cur.copy(f"COPY {table} ({', '.join(columns)}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)


def _columns(rows: Sequence[Sequence[Any]], width: int) -> list[list[Any]]:
    """Rows as columns (one array parameter each)."""
    if not rows:
        return [[] for _ in range(width)]
    return [list(column) for column in zip(*rows, strict=True)]


def _run_row(
    state: RunState, partition: int, offset: int, head: str
) -> tuple[Any, ...]:
    return (*run_row(state).values(), partition, offset, head)


def _record(received: Received[bytes], topic: str) -> Record:
    return Record(
        topic,
        received.partition,
        received.offset,
        received.key,
        received.message,
        received.headers,
    )
