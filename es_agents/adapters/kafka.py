"""The log on Apache Kafka: idempotent appends, per-run reads, commands and raw
records (dead letters).

``append`` returns only after the broker acknowledged every record (acks=all with the
idempotent producer, ``kafka_producer``: one per process, shared by every append).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, final

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from es_agents.adapters.coded_log import CodedLog
from es_agents.adapters.kafka_producer import KafkaProducerLink, _client
from es_agents.adapters.kept_tail import KeptTail
from es_agents.codec import AvroCodec
from es_agents.core.chain import Sealed
from es_agents.core.commands import Command
from es_agents.core.epochs import EpochFence, StartFloors
from es_agents.core.events import Event
from es_agents.errors import DecodeError, Unavailable
from es_agents.partitioner import partition_for
from es_agents.ports import Position, Record
from es_agents.retry import retrying
from es_agents.settings import KafkaSettings

log = logging.getLogger(__name__)


def where(msg: Message) -> tuple[str, int, int]:
    """(topic, partition, offset) of a message the broker returned or acknowledged."""
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    if topic is None or partition is None or offset is None:
        raise Unavailable(f"message without a position: {msg.error()}")
    return topic, partition, offset


# Commit errors that mean "the group moved on" (a rebalance, or this member leaving),
# not a failure.
_REBALANCING = frozenset(
    {
        KafkaError.ILLEGAL_GENERATION,
        KafkaError.REBALANCE_IN_PROGRESS,
        KafkaError.UNKNOWN_MEMBER_ID,
        KafkaError.FENCED_INSTANCE_ID,
        KafkaError._ASSIGNMENT_LOST,
        KafkaError._STATE,
        KafkaError._NO_OFFSET,
        # The consumer is closing (its revoke callback commits while it leaves):
        # the partition's next owner reads those commands again, a no-op if applied.
        KafkaError._DESTROY,
    }
)


def _is_eof(msg: Message) -> bool:
    err = msg.error()
    return err is not None and err.code() == KafkaError._PARTITION_EOF


# A partition its client does not know yet, or whose leader is changing (a broker of
# a cluster died): asked again until the metadata catches up.
_NOT_YET_KNOWN = frozenset(
    {
        KafkaError._UNKNOWN_PARTITION,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.OFFSET_NOT_AVAILABLE,
        KafkaError.REPLICA_NOT_AVAILABLE,
        KafkaError._DESTROY_BROKER,
        KafkaError._TRANSPORT,
    }
)


class _NotYetKnown(Exception):
    pass


def _watermarks(consumer: Consumer, tp: TopicPartition) -> tuple[int, int]:
    """Low and high watermarks; a topic created a moment ago may take a few hundred
    milliseconds to reach this client's metadata, and a partition whose leader died
    takes a few seconds to get another, so those are retried (for up to 30 s)."""

    def ask() -> tuple[int, int]:
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=10)
        except KafkaException as e:
            if e.args[0].code() in _NOT_YET_KNOWN:
                # Ask for the topic's metadata: a consumer does not learn about
                # topics it neither subscribes to nor is assigned by itself.
                try:
                    consumer.list_topics(tp.topic, timeout=5)
                except KafkaException as meta_error:
                    raise Unavailable(f"{tp.topic}: no metadata: {meta_error}") from e
                raise _NotYetKnown(str(e)) from e
            raise Unavailable(f"{tp.topic}[{tp.partition}]: no watermarks: {e}") from e
        return int(low), int(high)

    try:
        for tried in retrying(
            1000, on=(_NotYetKnown,), initial=0.05, maximum=0.5, within=30
        ):
            with tried:
                return ask()
    except _NotYetKnown as e:
        raise Unavailable(f"{tp.topic}[{tp.partition}]: no watermarks: {e}") from e
    raise Unavailable(f"{tp.topic}[{tp.partition}]: no watermarks")  # unreachable


def consume_now(consumer: Consumer, max_messages: int, timeout: float) -> list[Message]:
    """Up to ``max_messages``, returning as soon as one is there.

    librdkafka's batch ``consume`` waits for a full batch or the whole timeout; waiting
    for one message and then taking what is already fetched keeps batching under load
    without adding the timeout to every lone command.
    """
    first = consumer.consume(num_messages=1, timeout=timeout)
    if not first or max_messages == 1:
        return first
    return first + consumer.consume(num_messages=max_messages - 1, timeout=0)


@final
class KafkaEventLog(CodedLog):
    """The ``EventLog`` port over the configured topics."""

    def __init__(
        self,
        settings: KafkaSettings,
        codec: AvroCodec | None = None,
        link: KafkaProducerLink | None = None,
        restore: Callable[[Event], Event] | None = None,
        *,
        keep_tails: bool = False,
    ) -> None:
        """``keep_tails``: keep what reads of a run's events read of its partition
        (``KeptTail``): for a worker, which loads many runs of its partitions."""
        self.settings = settings
        super().__init__(codec, restore)
        self._tails: dict[int, KeptTail] | None = {} if keep_tails else None
        self._given_up: dict[int, int] = {}  # partition -> end when it grew too long
        self._owns_link = link is None
        self.link = link if link is not None else KafkaProducerLink(settings)
        self._reader: Consumer | None = None
        self._reader_lock = threading.Lock()
        self._partitions: int | None = None
        # Per events partition: the most zombie writes one read left out.
        self.fenced_writes: dict[int, int] = {}

    # -- writing ---------------------------------------------------------------
    def append_sealed(self, records: Sequence[Sealed]) -> list[Position]:
        topic = self.settings.events_topic
        futures = [
            self.link.produce(
                topic, r.event.run_id, r.value, list(r.headers) if r.headers else None
            )
            for r in records
        ]
        return self.link.wait(futures)

    def send(self, command: Command) -> Position:
        future = self.link.produce(
            self.settings.commands_topic, command.run_id, self.codec.encode(command)
        )
        return self.link.wait([future])[0]

    def send_all(self, commands: Sequence[Command]) -> list[Position]:
        """Produced together, acknowledged together (one wait for all)."""
        topic = self.settings.commands_topic
        futures = [
            self.link.produce(topic, c.run_id, self.codec.encode(c)) for c in commands
        ]
        return self.link.wait(futures)

    def produce(
        self,
        topic: str,
        key: str,
        value: bytes,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> Position:
        future = self.link.produce(
            topic, key, value, [(k, v) for k, v in headers] or None
        )
        return self.link.wait([future])[0]

    def partition_count(self) -> int:
        return self.link.partition_count(self.settings.events_topic)

    def partition_for(self, run_id: str) -> int:
        """The run's partition, by the events topic's own partition count (so
        clients configured with another count still find every run)."""
        if self._partitions is None:
            self._partitions = self.link.partition_count(self.settings.events_topic)
        return partition_for(run_id, self._partitions)

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
        """The run's events from ``from_offset`` of its partition to the current end
        (and at least to ``at_least``: see ``read_partition``) or to ``until_seq``,
        claim-checked payloads read back (``restore``), each with its bytes as
        written."""
        partition = self.partition_for(run_id)
        events: list[Sealed] = []
        records = self.read_partition(
            self.settings.events_topic,
            partition,
            from_offset,
            at_least=at_least,
            floors=floors,
            key=run_id,
        )
        try:
            for record in records:
                if record.key == run_id:
                    try:
                        event = self.codec.decode_event(record.value)
                    except DecodeError as e:
                        self.undecodable(record, e)
                        continue
                    events.append(
                        Sealed(self._restore(event) if restore else event, record.value)
                    )
                    if until_seq is not None and event.seq >= until_seq:
                        break
        finally:
            # Release the reader now, even when a payload does not restore: the
            # exception's traceback would keep this generator (and its lock) alive.
            records.close()  # type: ignore[attr-defined]
        return events

    def end_offset(self, topic: str, partition: int) -> int:
        """The partition's high watermark now."""
        with self._reader_lock:
            return _watermarks(
                self._reader_consumer(), TopicPartition(topic, partition)
            )[1]

    def read_commands(self, run_id: str) -> list[Command]:
        """The run's commands in ``es.commands`` (undecodable ones are skipped)."""
        partition = self.partition_for(run_id)
        commands: list[Command] = []
        topic = self.settings.commands_topic
        for record in self.read_partition(topic, partition):
            if record.key == run_id:
                try:
                    commands.append(self.codec.decode_command(record.value))
                except DecodeError:
                    continue  # the worker dead-letters it
        return commands

    def read_partition(
        self,
        topic: str,
        partition: int,
        start: int = 0,
        at_least: int = 0,
        *,
        floors: StartFloors | None = None,
        key: str | None = None,
    ) -> Iterator[Record]:
        """Records of one partition from ``start`` to its current end, as the fetch
        itself reports it (partition EOF): no separate round trip for the
        watermarks. The end a read_committed reader sees is the last stable offset,
        past any commit marker.

        ``at_least``: an offset this process knows is committed (its own last
        transaction). The end moves past a transaction only once the broker wrote its
        commit markers, which may be a moment after the commit returned; the read
        waits for that instead of missing it.

        On the events topic, only the events that count: claims and the writes of
        fenced workers are left out (``EpochFence`` from ``floors``).

        ``key``: only that key's records (and the keyless claims the fence needs)
        are made into records; the others are passed over unparsed.
        """
        wanted = key
        fence = None
        if topic == self.settings.events_topic:
            if isinstance(floors, EpochFence):
                fence = floors
                fence.auth = fence.auth or self.auth
            else:
                fence = EpochFence(floors, self.auth)
        tails = self._tails
        if key is not None and tails is not None and fence is not None:
            records: Iterator[Record] = self._kept(
                tails, partition, start, at_least, key
            )
        else:
            records = self._read(topic, partition, start, at_least, wanted)
        for record in records:
            forged = fence.forged if fence is not None else 0
            if fence is None or fence.admits(record.headers, record.value):
                yield record
            elif fence.forged > forged:
                self.left_out(record)
            elif fence.ignored > self.fenced_writes.get(partition, 0):
                self.fenced_writes[partition] = fence.ignored

    def _kept(
        self,
        tails: dict[int, KeptTail],
        partition: int,
        start: int,
        at_least: int,
        key: str,
    ) -> Iterator[Record]:
        """``key``'s records and the claims from ``start``, the stretch of the
        partition read before taken from memory (``KeptTail``), only what came
        after it read from the log."""
        topic = self.settings.events_topic
        asked = time.monotonic()
        with self._reader_lock:
            tail = tails.get(partition)
            behind = start < self._given_up.get(partition, -1)
            if behind or (tail is not None and not tail.covers(start)):
                # Below what is kept (a run resumed from the log's start), or a
                # stretch too long to keep: read it.
                return iter(
                    list(self._read_locked(topic, partition, start, at_least, key))
                )
            if tail is None or start > tail.end:
                tail = tails[partition] = KeptTail(start)
            if not tail.current_for(asked, at_least):
                began, end = time.monotonic(), [tail.end]
                for record in self._read_locked(
                    topic, partition, tail.end, at_least, None, end
                ):
                    tail.add(record)
                tail.read_to(end[0], began)
            tail.drop_below(start)
            found = list(tail.of(key, start))
            if tail.full:  # a projector far behind: read the log until it caught up
                del tails[partition]
                self._given_up[partition] = tail.end
        return iter(found)

    def _read(
        self,
        topic: str,
        partition: int,
        start: int,
        at_least: int,
        wanted: str | None,
    ) -> Iterator[Record]:
        with self._reader_lock:
            yield from self._read_locked(topic, partition, start, at_least, wanted)

    def _read_locked(  # noqa: PLR0917 - one read's parameters
        self,
        topic: str,
        partition: int,
        start: int,
        at_least: int,
        wanted: str | None,
        end: list[int] | None = None,
    ) -> Iterator[Record]:
        """The partition's records from ``start`` to its end (``end[0]`` is set to
        it), only ``wanted``'s and the keyless ones if given. The reader's lock is
        held."""
        key = wanted.encode() if wanted is not None else None
        reader = self._reader_consumer()
        tp = TopicPartition(topic, partition)
        # An explicit offset, even 0: OFFSET_BEGINNING costs an offset lookup
        # that librdkafka answers ~500 ms later. Below the log's start (records
        # deleted), the reader's auto.offset.reset=earliest applies.
        reader.assign([TopicPartition(topic, partition, start)])
        started = time.monotonic()
        checked = started
        try:
            while True:
                batch = consume_now(reader, 2000, 0.001)
                for msg in batch:
                    if _is_eof(msg):
                        if (msg.offset() or 0) >= at_least:
                            if end is not None:
                                end[0] = msg.offset() or 0
                            return
                        continue  # our own commit's markers are not written yet
                    if msg.error() is not None:
                        raise Unavailable(f"{topic}[{partition}]: {msg.error()}")
                    if key is not None and msg.key() not in (None, key):
                        continue  # another run's record
                    yield to_record(msg)
                now = time.monotonic()
                if not batch and now - checked > 0.05:
                    # No end reported for a while: ask the broker where the end is.
                    checked = now
                    high = _watermarks(reader, tp)[1]
                    position = reader.position([tp])[0].offset
                    if position >= max(high, at_least):
                        if end is not None:
                            end[0] = position
                        return
                if now - started > 30:
                    raise Unavailable(f"{topic}[{partition}]: no end reached in 30 s")
        finally:
            reader.unassign()

    def _reader_consumer(self) -> Consumer:
        if self._reader is None:
            conf = self.settings.consumer_config(f"{self.settings.topic_prefix}.reader")
            # Reads stop at the end the fetch reports (partition EOF), so never let
            # the broker park a fetch at the end of a partition (default 500 ms).
            conf["fetch.wait.max.ms"] = 0
            conf["enable.partition.eof"] = True
            self._reader = Consumer(_client(conf))
        return self._reader

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self._owns_link:
            self.link.close()


def to_record(msg: Message) -> Record:
    """A fetched message as a store-neutral record."""
    topic, partition, offset = where(msg)
    key = msg.key()
    raw: Any = msg.headers() or []
    pairs: list[tuple[str, Any]] = list(raw)
    headers = tuple(
        (k, v if isinstance(v, bytes) else str(v or "").encode()) for k, v in pairs
    )
    return Record(
        topic,
        partition,
        offset,
        key.decode(errors="replace") if isinstance(key, bytes) else key,
        msg.value() or b"",
        headers,
    )
