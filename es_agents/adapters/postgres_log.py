"""The log in Postgres alone (``ES_AGENTS_STORE=postgres``): the ``EventLog`` and a
fenced ``PartitionWriter`` over ``log_records`` (``projectors/sql/0005_*``).

Topics and partitions are kept as on Kafka, so everything above the port -- the
worker, the projector, resume, the CLI -- is the same. A record's offset comes from
its partition's ``log_heads`` row, updated in the appending transaction: appends to a
partition serialize on that row, so offsets are gapless and commit in order. Every
append notifies ``es_log`` (delivered at commit) to wake subscribers.

Fencing without a broker: a fenced append checks, in its transaction, that the
partition's epoch (``partition_epochs``) is still the writer's -- a new owner's epoch
waits for in-flight appends and refuses every later one -- and ``(run, seq)`` is
unique, so two writers can never interleave a run's events.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, final

import psycopg

from es_agents.adapters.coded_log import CodedLog
from es_agents.adapters.postgres import Database
from es_agents.codec import AvroCodec
from es_agents.core.chain import Sealed
from es_agents.core.commands import Command
from es_agents.core.epochs import StartFloors
from es_agents.core.events import Event
from es_agents.errors import AppendError, ConfigError, DecodeError, FencedError
from es_agents.partitioner import partition_for
from es_agents.ports import Position, Record
from es_agents.settings import KafkaSettings

CHANNEL = "es_log"
_READ_BATCH = 2000


def ensure_topics(db: Database, settings: KafkaSettings) -> dict[str, int]:
    """Create the topics' partitions that are missing; check that commands and
    events have the same count (a run's records share a partition number)."""
    topics = settings.topics
    with db.transaction() as conn:
        counts = dict(
            conn.execute(
                "SELECT topic, count(*) FROM log_heads WHERE topic = ANY(%s) "
                "GROUP BY topic",
                (topics,),
            ).fetchall()
        )
        for topic in topics:
            if topic not in counts:
                conn.execute(
                    "INSERT INTO log_heads (topic, partition) SELECT %s, "
                    "generate_series(0, %s - 1) ON CONFLICT DO NOTHING",
                    (topic, settings.partitions),
                )
                counts[topic] = settings.partitions
    commands, events = settings.commands_topic, settings.events_topic
    if counts[commands] != counts[events]:
        raise ConfigError(
            f"{commands} has {counts[commands]} partitions and {events} has "
            f"{counts[events]}: a run's commands and events must share a partition"
        )
    return {t: int(c) for t, c in counts.items()}


def _append(
    conn: psycopg.Connection[Any],
    topic: str,
    partition: int,
    rows: Sequence[tuple[str, int | None, bytes, str | None]],
) -> list[Position]:
    """Insert (key, seq, value, headers) rows at the partition's next offsets.

    One statement, never a pipeline: a client paused between a pipeline's messages
    leaves its server session *active* (waiting for the client), where
    ``idle_in_transaction_session_timeout`` never ends it, so the locks taken
    here (the partition's head, the epoch's share lock) would be held forever."""
    keys, seqs, values, headers = (list(c) for c in zip(*rows, strict=True))
    row = conn.execute(
        "WITH head AS (UPDATE log_heads SET next_offset = next_offset + %(n)s "
        "WHERE topic = %(topic)s AND partition = %(partition)s "
        "RETURNING next_offset - %(n)s AS first), "
        'appended AS (INSERT INTO log_records (topic, partition, "offset", key, '
        "seq, value, headers) SELECT %(topic)s, %(partition)s, head.first + r.i - 1, "
        "r.key, r.seq, r.value, r.headers FROM head, unnest(%(keys)s::text[], "
        "%(seqs)s::bigint[], %(values)s::bytea[], %(headers)s::jsonb[]) "
        "WITH ORDINALITY AS r(key, seq, value, headers, i)) "
        "SELECT head.first, pg_notify(%(channel)s, %(note)s) FROM head",
        {
            "n": len(rows),
            "topic": topic,
            "partition": partition,
            "keys": keys,
            "seqs": seqs,
            "values": values,
            "headers": headers,
            "channel": CHANNEL,
            "note": f"{topic}:{partition}",
        },
    ).fetchone()
    if row is None:
        raise ConfigError(
            f"topic {topic} has no partition {partition} (create it: es-agents topics)"
        )
    first = int(row[0])
    return [Position(topic, partition, first + i) for i in range(len(rows))]


@final
class PostgresEventLog(CodedLog):
    """The ``EventLog`` port on Postgres tables."""

    def __init__(
        self,
        db: Database,
        settings: KafkaSettings,
        codec: AvroCodec | None = None,
        restore: Callable[[Event], Event] | None = None,
    ) -> None:
        self.db = db
        self.settings = settings
        super().__init__(codec, restore)
        self._partitions: int | None = None

    # -- writing ---------------------------------------------------------------
    def append_sealed(self, records: Sequence[Sealed]) -> list[Position]:
        return self.append_fenced(records, None)

    def append_fenced(
        self, records: Sequence[Sealed], fence: tuple[str, int, int] | None
    ) -> list[Position]:
        """Append in one transaction; ``fence`` (group, partition, epoch): only while
        the partition's epoch is still this one."""
        by_partition: dict[int, list[tuple[str, int | None, bytes, str | None]]] = {}
        for r in records:
            e = r.event
            by_partition.setdefault(self.partition_for(e.run_id), []).append(
                (e.run_id, e.seq, r.value, _headers_json(r.headers))
            )
        topic = self.settings.events_topic
        positions: list[Position] = []
        try:
            with self.db.transaction() as conn:
                if fence is not None:
                    _check_epoch(conn, *fence)
                for partition, rows in sorted(by_partition.items()):
                    positions += _append(conn, topic, partition, rows)
        except psycopg.errors.UniqueViolation as e:
            raise FencedError(
                f"{topic}: another writer appended these runs' events first: {e}"
            ) from e
        except psycopg.Error as e:
            raise AppendError(f"{topic}: not appended: {e}") from e
        return positions

    def send(self, command: Command) -> Position:
        topic = self.settings.commands_topic
        return self._produce(topic, command.run_id, self.codec.encode(command), None)

    def produce(
        self,
        topic: str,
        key: str,
        value: bytes,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> Position:
        return self._produce(topic, key, value, _headers_json(headers))

    def _produce(
        self, topic: str, key: str, value: bytes, headers: str | None
    ) -> Position:
        partition = self.partition_for(key)
        try:
            with self.db.transaction() as conn:
                return _append(conn, topic, partition, [(key, None, value, headers)])[0]
        except psycopg.Error as e:
            raise AppendError(f"{topic}: not appended: {e}") from e

    def partition_for(self, run_id: str) -> int:
        return partition_for(run_id, self.partition_count())

    def partition_count(self) -> int:
        if self._partitions is None:
            with self.db.transaction() as conn:
                row = conn.execute(
                    "SELECT count(*) FROM log_heads WHERE topic = %s",
                    (self.settings.events_topic,),
                ).fetchone()
            count = int(row[0]) if row is not None else 0
            if count == 0:
                raise ConfigError(
                    f"topic {self.settings.events_topic} does not exist "
                    "(create it: es-agents topics)"
                )
            self._partitions = count
        return self._partitions

    # -- reading ---------------------------------------------------------------
    def read_sealed(
        self,
        run_id: str,
        from_offset: int = 0,
        at_least: int = 0,
        restore: bool = True,
        until_seq: int | None = None,
        *,
        floors: Mapping[str, int] | None = None,
    ) -> list[Sealed]:
        """The run's events from ``from_offset`` in log order (committed appends
        are visible at once here: ``at_least`` needs no wait)."""
        with self.db.transaction() as conn:
            rows = conn.execute(
                'SELECT value, partition, "offset", headers FROM log_records '
                "WHERE topic = %s "
                'AND key = %s AND "offset" >= %s AND seq IS NOT NULL '
                'AND seq <= %s ORDER BY "offset"',
                (
                    self.settings.events_topic,
                    run_id,
                    from_offset,
                    2**63 - 1 if until_seq is None else until_seq,
                ),
            ).fetchall()
        events = []
        for value, partition, offset, headers in rows:
            raw = bytes(value)
            found = record(
                self.settings.events_topic, partition, offset, run_id, raw, headers
            )
            if not self.authored((found.headers, raw)):
                self.left_out(found)
                continue
            try:
                event = self.codec.decode_event(raw)
            except DecodeError as e:
                self.undecodable(found, e)
                continue
            events.append(Sealed(self._restore(event) if restore else event, raw))
        return events

    def read_partition(
        self,
        topic: str,
        partition: int,
        start: int = 0,
        at_least: int = 0,
        *,
        floors: StartFloors | None = None,
    ) -> Iterator[Record]:
        position = start
        while True:
            with self.db.transaction() as conn:
                rows = conn.execute(
                    'SELECT "offset", key, value, headers FROM log_records '
                    'WHERE topic = %s AND partition = %s AND "offset" >= %s '
                    'ORDER BY "offset" LIMIT %s',
                    (topic, partition, position, _READ_BATCH),
                ).fetchall()
            for offset, key, value, headers in rows:
                yield record(topic, partition, offset, key, value, headers)
                position = int(offset) + 1
            if len(rows) < _READ_BATCH:
                return

    def end_offset(self, topic: str, partition: int) -> int:
        with self.db.transaction() as conn:
            row = conn.execute(
                "SELECT next_offset FROM log_heads WHERE topic = %s AND partition = %s",
                (topic, partition),
            ).fetchone()
        return int(row[0]) if row is not None else 0

    def close(self) -> None:
        pass  # the database pool is closed by its owner


def _headers_json(headers: Sequence[tuple[str, bytes]]) -> str | None:
    """Record headers as the ``headers`` column holds them (text values)."""
    if not headers:
        return None
    return json.dumps({k: v.decode(errors="replace") for k, v in headers})


def record(  # noqa: PLR0917 - one row's columns
    topic: str, partition: int, offset: int, key: str | None, value: bytes, headers: Any
) -> Record:
    pairs = tuple((k, str(v).encode()) for k, v in (headers or {}).items())
    return Record(topic, partition, int(offset), key, bytes(value), pairs)


def _check_epoch(
    conn: psycopg.Connection[Any], group: str, partition: int, epoch: int
) -> None:
    row = conn.execute(
        "SELECT epoch FROM partition_epochs WHERE group_id = %s AND partition = %s "
        "FOR SHARE",
        (group, partition),
    ).fetchone()
    if row is None or int(row[0]) != epoch:
        raise FencedError(
            f"partition {partition} of {group}: fenced (epoch "
            f"{None if row is None else row[0]} is not this writer's {epoch})"
        )


@final
class PostgresPartitionWriter:
    """Fenced appends to one events partition by the owner holding ``epoch``."""

    def __init__(
        self, log: PostgresEventLog, group: str, partition: int, epoch: int
    ) -> None:
        self._log = log
        self._fence = (group, partition, epoch)
        self.epoch = epoch
        self._closed = False
        self.committed_end = 0

    def append(self, records: Sequence[Sealed]) -> None:
        if self._closed:
            raise FencedError(
                f"partition {self._fence[1]}: this writer was closed: the partition "
                "was revoked"
            )
        positions = self._log.append_fenced(records, self._fence)
        if positions:
            self.committed_end = max(self.committed_end, positions[-1].offset + 1)

    def close(self) -> None:
        self._closed = True
