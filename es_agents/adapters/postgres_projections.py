"""The projections the runtime resumes from, read from Postgres (``Projections``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any, final

import psycopg

from es_agents.adapters.postgres import Database
from es_agents.core.authorship import (
    AUTH_HEADER,
    Authenticator,
    chunk_bytes,
    snapshot_bytes,
)
from es_agents.core.chain import GENESIS, digest
from es_agents.core.events import Event
from es_agents.core.fold import fold
from es_agents.core.reducer import reducer_version
from es_agents.core.run_row import RUN_COLUMNS
from es_agents.core.snapshot import (
    chunks_needed,
    from_snapshot,
    to_snapshot,
)
from es_agents.core.state import RunState
from es_agents.core.transcript import CHUNK, ChunkLoader, Message
from es_agents.errors import ConfigError, ProjectionIncomplete, ProjectionUntrusted
from es_agents.ports import EventLog, Positions, Projected

log = logging.getLogger(__name__)

# A runs row: the columns the fold determines, and the head of the run's hash chain.
_NAMES = (*RUN_COLUMNS, "head")
_COLUMNS = ", ".join(_NAMES)


# One statement, so one round trip and one consistent view: the latest snapshot of
# this reducer version with its event's bytes (part 0), the last ``last`` transcript
# chunks it names (1: all of them, or the last one when the rest is read on
# demand), the run's tail after it (2), the projector's offset and epoch floors on
# the run's partition (3), and how many of the snapshot's chunks are missing (4: a
# snapshot whose transcript is not all there is not used), and the archive of a
# run whose rows were purged (5). ``run_tails`` keeps the bytes of a run's events
# from its latest snapshot on (``run_events`` says only where each is in the log).
_LOAD = """
WITH s AS (
    SELECT seq, state, mac,
        (COALESCE((state ->> 'transcript_len')::int, 0) + %(chunk)s - 1) / %(chunk)s
        AS chunks
    FROM run_snapshots
    WHERE run_id = %(run)s AND reducer_version = %(reducer)s
    ORDER BY seq DESC LIMIT 1
)
SELECT 0, s.seq, s.state, t.payload, s.mac, t.mac FROM s
    LEFT JOIN run_tails t ON t.run_id = %(run)s AND t.seq = s.seq
UNION ALL
SELECT 1, t.chunk, t.messages, NULL, t.mac, NULL FROM s
    JOIN run_transcripts t ON t.run_id = %(run)s AND t.chunk < s.chunks
        AND t.chunk >= s.chunks - %(last)s
UNION ALL
SELECT 2, t.seq, NULL, t.payload, NULL, t.mac FROM run_tails t
    WHERE t.run_id = %(run)s AND t.seq > COALESCE((SELECT seq FROM s), -1)
UNION ALL
SELECT 3, o.next_offset, o.floors, NULL, NULL, NULL FROM projector_offsets o
    WHERE o.group_id = %(group)s AND o.topic = %(topic)s AND o.partition = %(partition)s
UNION ALL
SELECT 4, s.chunks - count(t.chunk), NULL, NULL, NULL, NULL FROM s
    LEFT JOIN run_transcripts t ON t.run_id = %(run)s AND t.chunk < s.chunks
    GROUP BY s.chunks
UNION ALL
SELECT 5, a.last_seq, NULL, NULL, a.key, NULL FROM run_archives a
    WHERE a.run_id = %(run)s AND a.purged_at IS NOT NULL
ORDER BY 1, 2
"""


def load_projected(
    conn: psycopg.Connection[Any],
    decode: Callable[[bytes], Event],
    run_id: str,
    restore: Callable[[Event], Event] | None = None,
    *,
    offset_of: tuple[str, str, int] | None = None,
    read_chunks: ChunkLoader | None = None,
    auth: Authenticator | None = None,
) -> tuple[
    RunState | None, int | None, int, bytes, tuple[int, dict[str, int]], str | None
]:
    """The latest snapshot (of this reducer version) plus the projected events after
    it: (state, snapshot seq or None, number of events folded, the chain's head:
    the digest of the last event's bytes, and the projector's (next offset, floors)
    for ``offset_of`` = (group, topic, partition)). O(K), in one statement.
    ``read_chunks``: the transcript's chunks are read by it when asked for (the
    last one comes with the statement), not all of them now. ``auth``: the
    snapshot and every event are verified against the writer key and the chain
    (a snapshot that does not verify is not used; an event that does not raises
    ``ProjectionUntrusted``). ``ProjectionIncomplete`` when the events before the
    tail are needed: no usable snapshot of this reducer version, and the tail
    kept does not start at the run's first event."""
    group, topic, partition = offset_of or (None, None, None)
    rows = conn.execute(
        _LOAD,
        {
            "run": run_id,
            "reducer": reducer_version(),
            "chunk": CHUNK,
            "last": 1 if read_chunks is not None else 2**31 - 1,
            "group": group,
            "topic": topic,
            "partition": partition,
        },
        # Planned once per connection, not at every resume (planning it took
        # longer than running it: 0.3 of 0.6 ms on an idle machine).
        prepare=True,
    ).fetchall()
    snapshot = next((r for r in rows if r[0] == 0), None)
    chunk_rows = [(int(r[1]), r[2], r[4]) for r in rows if r[0] == 1]
    chunks = [messages for _, messages, _ in chunk_rows]
    tail = [(int(r[1]), bytes(r[3]), r[5]) for r in rows if r[0] == 2]
    offset = next(((int(r[1]), dict(r[2])) for r in rows if r[0] == 3), (0, {}))
    missing = next((int(r[1]) for r in rows if r[0] == 4), 0)
    archived = next((str(r[4]) for r in rows if r[0] == 5), None)
    state = None
    head = GENESIS
    snapshot_seq = None
    if snapshot is not None and snapshot[3] is None:
        raise ProjectionIncomplete(
            f"run {run_id}: snapshot at seq {snapshot[1]} not used (its event's "
            "bytes are not in run_tails)"
        )
    if snapshot is not None:
        try:
            verified = auth is None or _snapshot_verifies(auth, run_id, snapshot)
            if auth is not None:
                _chunks_verify(auth, run_id, chunk_rows)
            state = _restored(snapshot[2], chunks, read_chunks, missing, verified)
            snapshot_seq = int(snapshot[1])
            head = digest(bytes(snapshot[3]))
        except (TypeError, KeyError, ValueError) as e:
            # A snapshot is a cache of the fold: one this code cannot read (written
            # by other code under the same reducer version), or one not signed by a
            # projector, is skipped; the events before it are the log's to give.
            raise ProjectionIncomplete(
                f"run {run_id}: snapshot at seq {snapshot[1]} not used ({e})"
            ) from e
    first = 0 if snapshot_seq is None else snapshot_seq + 1
    if tail and tail[0][0] != first:
        raise ProjectionIncomplete(
            f"run {run_id}: no snapshot of reducer version {reducer_version()} "
            f"before seq {tail[0][0]}"
        )
    if any(seq != first + n for n, (seq, _, _) in enumerate(tail)):
        raise ProjectionIncomplete(f"run {run_id}: its tail has gaps")
    events = [(raw, mac) for _, raw, mac in tail]
    state, head = fold_verified(
        events, decode, run_id, restore, auth, state=state, head=head
    )
    return state, snapshot_seq, len(events), head, offset, archived


def fold_verified(
    events: list[tuple[bytes, Any]],
    decode: Callable[[bytes], Event],
    run_id: str,
    restore: Callable[[Event], Event] | None,
    auth: Authenticator | None,
    *,
    state: RunState | None = None,
    head: bytes = GENESIS,
) -> tuple[RunState | None, bytes]:
    """Projected events (bytes, MAC) folded onto ``state``; with ``auth`` each must
    verify and chain on the one before, else ``ProjectionUntrusted``."""
    for raw, mac in events:
        if auth is not None and not auth.verifies(_header(mac), raw):
            raise ProjectionUntrusted(
                f"run {run_id}: a projected event does not verify against the "
                "writer key"
            )
        event = decode(raw)
        if auth is not None and event.prev != head:
            raise ProjectionUntrusted(
                f"run {run_id}: projected seq {event.seq} does not chain on seq "
                f"{event.seq - 1} (a row changed, dropped or added)"
            )
        if restore is not None:
            event = restore(event)
        state = fold(state if state is not None else RunState(run_id=run_id), event)
        head = digest(raw)
    return state, head


def _chunks_verify(
    auth: Authenticator, run_id: str, rows: list[tuple[int, Any, Any]]
) -> None:
    """``ValueError`` unless every (chunk, messages, MAC) verifies: a chunk is what
    a resumed run sends its model, so one the projector did not write is not used."""
    for chunk, messages, mac in rows:
        if not auth.verifies(_header(mac), chunk_bytes(run_id, chunk, messages)):
            raise ValueError(
                f"transcript chunk {chunk} does not verify against the writer key"
            )


def _header(mac: object) -> list[tuple[str, bytes]]:
    return [] if mac is None else [(AUTH_HEADER, str(mac).encode())]


def _snapshot_verifies(auth: Authenticator, run_id: str, row: Any) -> bool:
    """The snapshot's MAC, and its event's: the state is the projector's, taken at
    that event of the log."""
    _, seq, state, payload, snapshot_mac, event_mac = row
    if payload is None or not auth.verifies(_header(event_mac), bytes(payload)):
        return False
    signed = snapshot_bytes(run_id, int(seq), digest(bytes(payload)), state)
    return auth.verifies(_header(snapshot_mac), signed)


def _restored(
    data: dict[str, Any],
    chunks: list[list[Message]],
    read_chunks: ChunkLoader | None,
    missing: int,
    verified: bool = True,
) -> RunState:
    """The snapshot's state; ``ValueError`` if chunks of its transcript are gone
    or it does not verify against the writer key."""
    if not verified:
        raise ValueError("it does not verify against the writer key")
    if missing > 0:
        raise ValueError(f"{missing} of its transcript chunks are missing")
    return from_snapshot(data, chunks, read_chunks)


def _chunks(
    conn: psycopg.Connection[Any], run_id: str, data: dict[str, Any]
) -> list[list[dict[str, Any]]]:
    """The stored transcript chunks a snapshot needs, in order."""
    needed = chunks_needed(data)
    if needed == 0:
        return []
    return [
        row[0]
        for row in conn.execute(
            "SELECT messages FROM run_transcripts WHERE run_id = %s AND chunk < %s "
            "ORDER BY chunk",
            (run_id, needed),
        )
    ]


def whole_snapshot(
    conn: psycopg.Connection[Any], run_id: str, data: dict[str, Any]
) -> dict[str, Any]:
    """A snapshot with its transcript inline (as the fold would write it)."""
    if "transcript" in data:
        return data
    return to_snapshot(from_snapshot(data, _chunks(conn, run_id, data)))


@final
class PostgresProjections:
    def __init__(
        self,
        db: Database,
        decode: Callable[[bytes], Event],
        group_id: str,
        events_topic: str,
    ) -> None:
        self._db = db
        self._decode = decode
        self._group = group_id
        self._topic = events_topic
        # The writer key: snapshots and events are resumed from only if they
        # verify (set with the log's, by the composition root).
        self.auth: Authenticator | None = None
        # The log, which holds the events before a run's tail (set with the key).
        self.log: EventLog | None = None

    def projected_until(self, partition: int) -> int:
        with self._db.transaction() as conn:
            return self._offset(conn, partition)[0]

    def _offset(
        self, conn: psycopg.Connection[Any], partition: int
    ) -> tuple[int, dict[str, int]]:
        """The projector's next offset and the partition's epoch floors there."""
        row = conn.execute(
            "SELECT next_offset, floors FROM projector_offsets WHERE group_id = %s "
            "AND topic = %s AND partition = %s",
            (self._group, self._topic, partition),
        ).fetchone()
        return (int(row[0]), dict(row[1])) if row is not None else (0, {})

    def load(
        self, run_id: str, partition: int, restore: Callable[[Event], Event] | None
    ) -> Projected:
        with self._db.statement() as conn:
            state, snapshot_seq, folded, head, (offset, floors), archived = (
                load_projected(
                    conn,
                    self._decode,
                    run_id,
                    restore,
                    offset_of=(self._group, self._topic, partition),
                    read_chunks=self._chunk_reader(run_id, restore),
                    auth=self.auth,
                )
            )
        return Projected(state, snapshot_seq, folded, offset, head, floors, archived)

    def _chunk_reader(
        self, run_id: str, restore: Callable[[Event], Event] | None
    ) -> ChunkLoader:
        """Reads a resumed run's transcript chunks when its messages are asked for
        (the model is sent them), in one statement. With the writer key, a chunk
        that does not verify (changed, or written before chunks were signed) is not
        sent: the chunks are rebuilt from the run's projected events, each verified
        and chained, and the mismatch is reported."""

        def read(first: int, last: int) -> list[tuple[int, list[Message]]]:
            with self._db.statement() as conn:
                rows = conn.execute(
                    "SELECT chunk, messages, mac FROM run_transcripts "
                    "WHERE run_id = %s AND chunk >= %s AND chunk < %s ORDER BY chunk",
                    (run_id, first, last),
                ).fetchall()
            found = [(int(r[0]), list(r[1]), r[2]) for r in rows]
            if self.auth is not None:
                try:
                    _chunks_verify(self.auth, run_id, found)
                except ValueError as e:
                    log.warning("run %s: %s: rebuilt from its events", run_id, e)
                    return self._rebuilt(run_id, restore, first, last)
            return [(chunk, messages) for chunk, messages, _ in found]

        return read

    def _rebuilt(
        self,
        run_id: str,
        restore: Callable[[Event], Event] | None,
        first: int,
        last: int,
    ) -> list[tuple[int, list[Message]]]:
        """Chunks ``first`` to ``last`` of the transcript the run's log folds to
        (the transcript only grows: its prefix is the chunks'); each event read
        from the log is a worker's and chains on the one before."""
        if self.log is None:
            raise ProjectionIncomplete(f"run {run_id}: no log to rebuild chunks from")
        state = None
        head = GENESIS
        for sealed in self.log.read_sealed(
            run_id, from_offset=self.first_offset(run_id) or 0, restore=False
        ):
            if sealed.event.prev != head:
                continue  # not a link of this run's chain
            event = restore(sealed.event) if restore is not None else sealed.event
            state = fold(state or RunState(run_id=run_id), event)
            head = sealed.digest
        messages = list(state.transcript) if state is not None else []
        return [(n, messages[n * CHUNK : (n + 1) * CHUNK]) for n in range(first, last)]

    def running(self, partition: int, agent: str) -> set[str]:
        with self._db.transaction() as conn:
            rows = conn.execute(
                "SELECT run_id FROM runs WHERE partition = %s AND agent = %s "
                "AND status IN ('running', 'blocked')",
                (partition, agent),
            ).fetchall()
        return {str(r[0]) for r in rows}

    def next_epoch(self, group: str, partition: int) -> int:
        with self._db.transaction() as conn:
            row = conn.execute(
                "INSERT INTO partition_epochs (group_id, partition, epoch) "
                "VALUES (%s, %s, 1) ON CONFLICT (group_id, partition) DO UPDATE "
                "SET epoch = partition_epochs.epoch + 1, taken_at = now() "
                "RETURNING epoch",
                (group, partition),
            ).fetchone()
        if row is None:
            raise ConfigError(f"no epoch for partition {partition} of {group}")
        return int(row[0])

    def current_epoch(self, group: str, partition: int) -> int | None:
        with self._db.statement() as conn:
            row = conn.execute(
                "SELECT epoch FROM partition_epochs "
                "WHERE group_id = %s AND partition = %s",
                (group, partition),
            ).fetchone()
        return None if row is None else int(row[0])

    def dead_letters(self, run_id: str) -> list[tuple[str, int, int, str]]:
        with self._db.transaction() as conn:
            rows = conn.execute(
                'SELECT topic, partition, "offset", reason FROM dead_letters '
                'WHERE run_id = %s ORDER BY topic, partition, "offset"',
                (run_id,),
            ).fetchall()
        return [(str(t), int(p), int(o), str(r)) for t, p, o, r in rows]

    def positions(self, run_id: str, partition: int) -> Positions:
        with self._db.statement() as conn:
            rows = conn.execute(
                'SELECT 0, "offset", seq, NULL FROM run_events WHERE run_id = %(run)s '
                "UNION ALL SELECT 1, next_offset, 0, floors FROM projector_offsets "
                "WHERE group_id = %(group)s AND topic = %(topic)s "
                "AND partition = %(partition)s "
                "UNION ALL SELECT 2, 0, 0, to_jsonb(key) FROM run_archives "
                "WHERE run_id = %(run)s AND purged_at IS NOT NULL",
                {
                    "run": run_id,
                    "group": self._group,
                    "topic": self._topic,
                    "partition": partition,
                },
            ).fetchall()
        offsets = {int(r[1]): int(r[2]) for r in rows if r[0] == 0}
        until, floors = next(
            ((int(r[1]), dict(r[3])) for r in rows if r[0] == 1), (0, {})
        )
        archived = next((str(r[3]) for r in rows if r[0] == 2), None)
        return Positions(offsets, until, floors, archived)

    def run_row(self, run_id: str) -> dict[str, object] | None:
        with self._db.transaction() as conn:
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM runs WHERE run_id = %s",  # noqa: S608
                (run_id,),
            ).fetchone()
        return None if row is None else dict(zip(_NAMES, row, strict=True))

    def latest_snapshot(self, run_id: str) -> tuple[int, object] | None:
        with self._db.transaction() as conn:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            row = conn.execute(
                "SELECT seq, state FROM run_snapshots WHERE run_id = %s "
                "AND reducer_version = %s ORDER BY seq DESC LIMIT 1",
                (run_id, reducer_version()),
            ).fetchone()
            if row is None:
                return None
            try:
                return int(row[0]), whole_snapshot(conn, run_id, row[1])
            except (TypeError, KeyError, ValueError):
                return int(row[0]), row[1]  # replay reports it as it is

    def run_rows(self, run_prefix: str = "") -> dict[str, dict[str, object]]:
        with self._db.transaction() as conn:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM runs WHERE starts_with(run_id, %s)",  # noqa: S608
                (run_prefix,),
            ).fetchall()
        return {str(r[0]): dict(zip(_NAMES, r, strict=True)) for r in rows}

    def event_digests(self, run_prefix: str = "") -> dict[str, dict[int, bytes | None]]:
        out: dict[str, dict[int, bytes | None]] = {}
        with self._db.transaction() as conn:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            cursor = conn.execute(
                "SELECT coalesce(e.run_id, t.run_id), coalesce(e.seq, t.seq), "
                "sha256(t.payload) FROM run_events e FULL JOIN run_tails t "
                "ON t.run_id = e.run_id AND t.seq = e.seq "
                "WHERE starts_with(coalesce(e.run_id, t.run_id), %s)",
                (run_prefix,),
            )
            for run_id, seq, sha in cursor:
                out.setdefault(str(run_id), {})[int(seq)] = (
                    bytes(sha) if sha is not None else None
                )
        return out

    def snapshot_states(self, run_prefix: str = "") -> dict[str, tuple[int, object]]:
        with self._db.transaction() as conn:
            rows = conn.execute(
                "SELECT DISTINCT ON (run_id) run_id, seq, state FROM run_snapshots "
                "WHERE starts_with(run_id, %s) AND reducer_version = %s "
                "ORDER BY run_id, seq DESC",
                (run_prefix, reducer_version()),
            ).fetchall()
        return {str(r[0]): (int(r[1]), r[2]) for r in rows}

    def first_offset(self, run_id: str) -> int | None:
        with self._db.transaction() as conn:
            row = conn.execute(
                'SELECT "offset" FROM run_events WHERE run_id = %s AND seq = 0',
                (run_id,),
            ).fetchone()
        return None if row is None else int(row[0])

    def runs(
        self,
        status: str | None,
        limit: int,
        agent: str | None = None,
        since: datetime | None = None,
    ) -> list[dict[str, object]]:
        with self._db.transaction() as conn:
            cur = conn.execute(
                "SELECT run_id, agent, status, step, last_seq + 1 AS events, "
                "waiting_reason, waiting_gate, model_id, prompt_tokens, "
                "completion_tokens, updated_at, last_message FROM runs "
                "WHERE (%(status)s::text IS NULL OR status = %(status)s) "
                "AND (%(agent)s::text IS NULL OR agent = %(agent)s) "
                "AND (%(since)s::timestamptz IS NULL OR updated_at >= %(since)s) "
                "ORDER BY updated_at DESC LIMIT %(limit)s",
                {"status": status, "agent": agent, "since": since, "limit": limit},
            )
            names = [d.name for d in cur.description or []]
            return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
