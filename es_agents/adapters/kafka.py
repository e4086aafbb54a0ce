"""The log on Apache Kafka: idempotent appends, per-run reads, commands and the DLQ.

``append`` returns only after the broker acknowledged every record (acks=all with the
idempotent producer). A background thread serves librdkafka's delivery callbacks, so
appends from many threads share the producer and are batched by librdkafka while an
earlier request is in flight: group commit without a timer.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar, final

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from es_agents.codec import AvroCodec
from es_agents.core.commands import Command
from es_agents.core.events import Event
from es_agents.errors import AppendError, ConfigError, DecodeError, Unavailable
from es_agents.partitioner import partition_for
from es_agents.ports import Position
from es_agents.retry import retrying
from es_agents.settings import KafkaSettings

log = logging.getLogger(__name__)

T = TypeVar("T", Event, Command)


_client_log = logging.getLogger("es_agents.librdkafka")


def _error_cb(err: KafkaError) -> None:
    # librdkafka retries transient errors itself; fatal ones also fail deliveries.
    if err.fatal():
        log.error("kafka client fatal error: %s", err)
    else:
        log.debug("kafka client error (retried by librdkafka): %s", err)


def _client(conf: Mapping[str, object]) -> dict[str, Any]:
    """librdkafka settings plus our callbacks: errors and logs go to Python logging."""
    return {**conf, "error_cb": _error_cb, "logger": _client_log}


# The log is the system of record: nothing in it may ever expire.
FOREVER = {"retention.ms": "-1", "retention.bytes": "-1"}


def ensure_topics(
    settings: KafkaSettings, timeout: float = 30.0, fix_retention: bool = False
) -> dict[str, int]:
    """Create the commands, events and DLQ topics that are missing (retention
    forever, replication and ``min.insync.replicas`` from settings), and check the
    ones that exist: commands and events must have the same partition count, and no
    topic may expire records. Returns each topic's partition count.

    The partition count of an existing topic is the topic's own; the configured one
    only applies when creating.
    """
    admin = AdminClient(_client(settings.to_librdkafka()))
    topics = [settings.commands_topic, settings.events_topic, settings.dlq_topic]
    try:
        existing = admin.list_topics(timeout=timeout).topics
    except KafkaException as e:
        raise Unavailable(f"kafka at {settings.bootstrap_servers}: {e}") from e
    config = {
        **FOREVER,
        "min.insync.replicas": str(settings.min_insync_replicas),
    }
    missing = [
        NewTopic(
            t,
            num_partitions=settings.partitions,
            replication_factor=settings.replication_factor,
            config=config,
        )
        for t in topics
        if t not in existing
    ]
    if missing:
        for topic, future in admin.create_topics(
            missing, request_timeout=timeout
        ).items():
            try:
                future.result(timeout)
            except KafkaException as e:
                if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise Unavailable(f"cannot create topic {topic}: {e}") from e
        existing = _wait_for_leaders(admin, topics, timeout)
    counts = {t: len(existing[t].partitions) for t in topics if t in existing}
    commands, events = settings.commands_topic, settings.events_topic
    if counts.get(commands) != counts.get(events):
        raise ConfigError(
            f"{commands} has {counts.get(commands)} partitions and {events} has "
            f"{counts.get(events)}: a run's commands and events must share a partition"
        )
    _check_retention(admin, topics, timeout, fix_retention)
    return counts


def _check_retention(
    admin: AdminClient, topics: list[str], timeout: float, fix: bool
) -> None:
    """Refuse topics that would expire records (or make them keep everything)."""
    resources = [ConfigResource(ResourceType.TOPIC, t) for t in topics]
    finite: dict[str, dict[str, str]] = {}
    try:
        for resource, future in admin.describe_configs(
            resources, request_timeout=timeout
        ).items():
            entries = future.result(timeout)
            wrong = {
                k: str(entries[k].value)
                for k, v in FOREVER.items()
                if k in entries and str(entries[k].value) != v
            }
            if wrong:
                finite[resource.name] = wrong
    except KafkaException as e:
        raise Unavailable(f"cannot read topic configs: {e}") from e
    if not finite:
        return
    if fix:
        alter = [
            ConfigResource(
                ResourceType.TOPIC,
                topic,
                incremental_configs=[
                    ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
                    for k, v in FOREVER.items()
                ],
            )
            for topic in finite
        ]
        try:
            for future in admin.incremental_alter_configs(alter).values():
                future.result(timeout)
        except KafkaException as e:
            raise Unavailable(f"cannot change topic retention: {e}") from e
        log.warning("topics %s now keep every record", ", ".join(sorted(finite)))
        return
    detail = "; ".join(
        f"{t}: {', '.join(f'{k}={v}' for k, v in c.items())}"
        for t, c in sorted(finite.items())
    )
    raise ConfigError(
        f"topics would expire records ({detail}). The log is the system of record: "
        "its topics must keep every record (retention.ms=-1, retention.bytes=-1). "
        "Fix with `es-agents topics --fix-retention` (or kafka-configs.sh --alter "
        "--entity-type topics --entity-name TOPIC --add-config "
        "retention.ms=-1,retention.bytes=-1)."
    )


def where(msg: Message) -> tuple[str, int, int]:
    """(topic, partition, offset) of a message the broker returned or acknowledged."""
    topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
    if topic is None or partition is None or offset is None:
        raise Unavailable(f"message without a position: {msg.error()}")
    return topic, partition, offset


# Commit errors that mean "the group moved on": a rebalance, not a failure.
_REBALANCING = frozenset(
    {
        KafkaError.ILLEGAL_GENERATION,
        KafkaError.REBALANCE_IN_PROGRESS,
        KafkaError.UNKNOWN_MEMBER_ID,
        KafkaError.FENCED_INSTANCE_ID,
        KafkaError._ASSIGNMENT_LOST,
        KafkaError._STATE,
        KafkaError._NO_OFFSET,
    }
)


def _is_eof(msg: Message) -> bool:
    err = msg.error()
    return err is not None and err.code() == KafkaError._PARTITION_EOF


_NOT_YET_KNOWN = frozenset(
    {
        KafkaError._UNKNOWN_PARTITION,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
    }
)


class _NotYetKnown(Exception):
    pass


def _watermarks(consumer: Consumer, tp: TopicPartition) -> tuple[int, int]:
    """Low and high watermarks; a topic created a moment ago may take a few hundred
    milliseconds to reach this client's metadata, so unknown partitions are retried
    (for up to 10 s, by the retry policy)."""

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
            1000, on=(_NotYetKnown,), initial=0.05, maximum=0.2, within=10
        ):
            with tried:
                return ask()
    except _NotYetKnown as e:
        raise Unavailable(f"{tp.topic}[{tp.partition}]: no watermarks: {e}") from e
    raise Unavailable(f"{tp.topic}[{tp.partition}]: no watermarks")  # unreachable


def _wait_for_leaders(admin: AdminClient, topics: list[str], timeout: float) -> Any:
    """New topics are usable once every partition has a leader in the metadata;
    polled by the retry policy for up to ``timeout`` seconds."""

    def metadata() -> Any:
        existing = admin.list_topics(timeout=timeout).topics
        ready = all(
            t in existing
            and existing[t].partitions
            and all(
                p.leader >= 0 and p.error is None
                for p in existing[t].partitions.values()
            )
            for t in topics
        )
        if not ready:
            raise _NotYetKnown(f"topics {topics} have partitions without a leader")
        return existing

    try:
        for tried in retrying(
            1000, on=(_NotYetKnown,), initial=0.05, maximum=0.2, within=timeout
        ):
            with tried:
                return metadata()
    except _NotYetKnown:
        pass
    return admin.list_topics(timeout=timeout).topics  # the caller checks what is there


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
class KafkaProducerLink:
    """One idempotent producer per process, with futures for acknowledgements."""

    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings
        self._producer = Producer(_client(settings.producer_config()))
        self._closed = threading.Event()
        self._poller = threading.Thread(
            target=self._poll, name="es-kafka-acks", daemon=True
        )
        self._poller.start()

    def _poll(self) -> None:
        while not self._closed.is_set():
            self._producer.poll(0.05)

    def produce(
        self,
        topic: str,
        key: str,
        value: bytes,
        headers: list[tuple[str, str | bytes | None]] | None = None,
    ) -> Future[Position]:
        future: Future[Position] = Future()

        def delivered(err: KafkaError | None, msg: Message) -> None:
            if err is not None:
                future.set_exception(
                    AppendError(f"{topic} key {key}: not acknowledged: {err}")
                )
            else:
                future.set_result(Position(*where(msg)))

        while True:
            try:
                self._producer.produce(
                    topic, value=value, key=key, headers=headers, on_delivery=delivered
                )
            except BufferError:
                # The local queue is full: wait for acknowledgements to drain it.
                self._producer.poll(0.01)
            except KafkaException as e:
                raise AppendError(f"{topic} key {key}: cannot produce: {e}") from e
            else:
                return future

    def wait(self, futures: Sequence[Future[Position]]) -> list[Position]:
        """Block until every future has its acknowledgement (or its error).

        The poller thread serves delivery reports and completes the futures. (Serving
        them here with ``flush`` looks cheaper but polls in 10 ms slices whenever
        another thread took the report.)
        """
        timeout = self.settings.delivery_timeout_ms / 1000 + 5
        try:
            return [f.result(timeout) for f in futures]
        except TimeoutError as e:
            raise AppendError(f"no acknowledgement within {timeout:.0f}s") from e

    def partition_count(self, topic: str) -> int:
        """The topic's partition count, from the cluster's metadata."""
        try:
            meta = self._producer.list_topics(topic, timeout=10).topics.get(topic)
        except KafkaException as e:
            raise Unavailable(f"{topic}: no metadata: {e}") from e
        if meta is None or meta.error is not None or not meta.partitions:
            raise ConfigError(
                f"topic {topic} does not exist (create it: es-agents topics)"
            )
        return len(meta.partitions)

    def close(self) -> None:
        self._producer.flush(self.settings.delivery_timeout_ms / 1000)
        self._closed.set()
        self._poller.join()


@final
class KafkaEventLog:
    """``EventLog`` and ``CommandBus`` over the configured topics."""

    def __init__(
        self,
        settings: KafkaSettings,
        codec: AvroCodec | None = None,
        link: KafkaProducerLink | None = None,
        restore: Callable[[Event], Event] | None = None,
    ) -> None:
        self.settings = settings
        self.codec = codec if codec is not None else AvroCodec()
        # Reads a claim-checked payload back into its event (the claim check's
        # ``restore``); the identity when payloads are not claim-checked.
        self.restore: Callable[[Event], Event] = restore or (lambda event: event)
        self._owns_link = link is None
        self.link = link if link is not None else KafkaProducerLink(settings)
        self._reader: Consumer | None = None
        self._reader_lock = threading.Lock()
        self._partitions: int | None = None

    # -- writing ---------------------------------------------------------------
    def append(self, events: Sequence[Event]) -> list[Position]:
        futures = [
            self.link.produce(
                self.settings.events_topic, e.run_id, self.codec.encode(e)
            )
            for e in events
        ]
        return self.link.wait(futures)

    def send(self, command: Command) -> Position:
        future = self.link.produce(
            self.settings.commands_topic, command.run_id, self.codec.encode(command)
        )
        return self.link.wait([future])[0]

    def partition_for(self, run_id: str) -> int:
        """The run's partition, by the events topic's own partition count (so
        clients configured with another count still find every run)."""
        if self._partitions is None:
            self._partitions = self.link.partition_count(self.settings.events_topic)
        return partition_for(run_id, self._partitions)

    # -- reading ---------------------------------------------------------------
    def read_run(
        self,
        run_id: str,
        from_offset: int = 0,
        at_least: int = 0,
        restore: bool = True,
    ) -> list[Event]:
        """The run's events from ``from_offset`` of its partition to the current end
        (and at least to ``at_least``: see ``read_partition``), claim-checked
        payloads read back (``restore``)."""
        partition = self.partition_for(run_id)
        key = run_id.encode()
        events: list[Event] = []
        for msg in self.read_partition(
            self.settings.events_topic, partition, from_offset, at_least=at_least
        ):
            if msg.key() == key:
                event = self._decode_at(msg)
                events.append(self.restore(event) if restore else event)
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
        key = run_id.encode()
        commands: list[Command] = []
        topic = self.settings.commands_topic
        for msg in self.read_partition(topic, partition):
            if msg.key() == key:
                try:
                    commands.append(self.codec.decode_command(msg.value() or b""))
                except DecodeError:
                    continue  # the worker dead-letters it
        return commands

    def read_partition(
        self, topic: str, partition: int, start: int = 0, at_least: int = 0
    ) -> Iterator[Message]:
        """Messages of one partition from ``start`` to its current end, as the fetch
        itself reports it (partition EOF): no separate round trip for the
        watermarks. The end a read_committed reader sees is the last stable offset,
        past any commit marker.

        ``at_least``: an offset this process knows is committed (its own last
        transaction). The end moves past a transaction only once the broker wrote its
        commit markers, which may be a moment after the commit returned; the read
        waits for that instead of missing it.
        """
        with self._reader_lock:
            reader = self._reader_consumer()
            tp = TopicPartition(topic, partition)
            reader.assign([TopicPartition(topic, partition, start or OFFSET_BEGINNING)])
            started = time.monotonic()
            checked = started
            try:
                while True:
                    batch = consume_now(reader, 2000, 0.001)
                    for msg in batch:
                        if _is_eof(msg):
                            if (msg.offset() or 0) >= at_least:
                                return
                            continue  # our own commit's markers are not written yet
                        if msg.error() is not None:
                            raise Unavailable(f"{topic}[{partition}]: {msg.error()}")
                        yield msg
                    now = time.monotonic()
                    if not batch and now - checked > 0.05:
                        # No end reported for a while: ask the broker where the end is.
                        checked = now
                        high = _watermarks(reader, tp)[1]
                        position = reader.position([tp])[0].offset
                        if position >= max(high, at_least):
                            return
                    if now - started > 30:
                        raise Unavailable(
                            f"{topic}[{partition}]: no end reached in 30 s"
                        )
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

    def _decode_at(self, msg: Message) -> Event:
        try:
            return self.codec.decode_event(msg.value() or b"")
        except DecodeError as e:
            raise DecodeError(
                f"{msg.topic()}[{msg.partition()}]@{msg.offset()}: {e}"
            ) from e

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self._owns_link:
            self.link.close()


@dataclass(frozen=True, slots=True)
class Received(Generic[T]):
    """A decoded message and where it was read."""

    message: T
    topic: str
    partition: int
    offset: int


@final
class DeadLetterQueue:
    """``es.dlq``: the original key and bytes, with the reason and origin in headers."""

    def __init__(self, settings: KafkaSettings, link: KafkaProducerLink) -> None:
        self.topic = settings.dlq_topic
        self._link = link

    def send(self, msg: Message, reason: str) -> Position:
        key = msg.key()
        return self.send_command(
            key.decode(errors="replace") if isinstance(key, bytes) else key or "",
            msg.value() or b"",
            Position(*where(msg)),
            reason,
        )

    def send_command(
        self, key: str, value: bytes, origin: Position, reason: str
    ) -> Position:
        """Dead-letter ``value`` (read at ``origin``) with the reason; acknowledged."""
        headers: list[tuple[str, str | bytes | None]] = [
            ("es.dlq.reason", reason.encode()),
            ("es.dlq.topic", origin.topic.encode()),
            ("es.dlq.partition", str(origin.partition).encode()),
            ("es.dlq.offset", str(origin.offset).encode()),
            ("es.dlq.at", datetime.now(UTC).isoformat().encode()),
        ]
        future = self._link.produce(self.topic, key, value, headers)
        position = self._link.wait([future])[0]
        log.warning(
            "dead-lettered %s[%d]@%d to %s@%d: %s",
            origin.topic,
            origin.partition,
            origin.offset,
            self.topic,
            position.offset,
            reason,
        )
        return position


@final
class KafkaSource(Generic[T]):
    """A consumer-group member that yields decoded messages and dead-letters the rest.

    A message that does not decode is written to the DLQ (and acknowledged there)
    before the source moves past it, so nothing is lost and nothing stalls the
    partition. Offsets are committed only by ``commit``, after the caller acted.
    """

    def __init__(
        self,
        settings: KafkaSettings,
        topic: str,
        group_id: str,
        decode: Callable[[bytes], T],
        dlq: DeadLetterQueue,
        *,
        on_assign: Callable[[list[int]], None] | None = None,
        on_revoke: Callable[[list[int]], None] | None = None,
        extra: Mapping[str, str | int] | None = None,
    ) -> None:
        self.topic = topic
        self._decode: Callable[[bytes], T] = decode
        self._dlq = dlq
        self._consumer = Consumer(
            _client(
                {
                    **settings.consumer_config(group_id),
                    "enable.partition.eof": True,
                    **(extra or {}),
                }
            )
        )
        self._at_end: set[int] = set()
        self._skipped: list[tuple[int, int]] = []
        self._on_assign = on_assign
        self._on_revoke = on_revoke
        self._consumer.subscribe(
            [topic],
            on_assign=self._assigned,
            on_revoke=self._revoked,
            on_lost=self._revoked,
        )
        self.dead_lettered = 0

    def _assigned(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._at_end -= {p.partition for p in partitions}
        if self._on_assign is not None:
            self._on_assign([p.partition for p in partitions])

    def _revoked(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if self._on_revoke is not None:
            self._on_revoke([p.partition for p in partitions])

    def poll(self, timeout: float = 1.0, max_messages: int = 500) -> list[Received[T]]:
        out: list[Received[T]] = []
        for msg in consume_now(self._consumer, max_messages, timeout):
            err = msg.error()
            if err is not None and err.code() == KafkaError._PARTITION_EOF:
                self._at_end.add(where(msg)[1])
                continue
            if err is not None:
                if err.fatal():
                    raise Unavailable(f"{self.topic}: fatal consumer error: {err}")
                log.warning("%s: consumer error: %s", self.topic, err)
                continue
            self._at_end.discard(where(msg)[1])
            try:
                message = self._decode(msg.value() or b"")
            except DecodeError as e:
                self._dlq.send(msg, str(e))
                self.dead_lettered += 1
                self._mark(msg)
                self._skipped.append(where(msg)[1:])
                continue
            out.append(Received(message, *where(msg)))
            self._mark(msg)
        return out

    def _mark(self, msg: Message) -> None:
        topic, partition, offset = where(msg)
        self._consumer.store_offsets(
            offsets=[TopicPartition(topic, partition, offset + 1)]
        )

    def caught_up(self) -> bool:
        """True when assigned and every assigned partition was read to its end
        (librdkafka's partition-EOF events, so this asks the broker nothing)."""
        assignment = {tp.partition for tp in self._consumer.assignment()}
        return bool(assignment) and assignment <= self._at_end

    def drain_skipped(self) -> list[tuple[int, int]]:
        """(partition, offset) of messages dead-lettered since the last call."""
        skipped, self._skipped = self._skipped, []
        return skipped

    def commit_offsets(self, offsets: Mapping[int, int]) -> bool:
        """Commit next offsets per partition (the caller tracks what was applied).

        False when the group moved on (a rebalance: the partition's next owner reads
        those messages again, and applying a command twice is a no-op): that is
        routine. Any other failure (the coordinator or the broker out of reach)
        raises ``Unavailable``: crash-only, the process restarts with new clients.
        """
        try:
            self._consumer.commit(
                offsets=[TopicPartition(self.topic, p, o) for p, o in offsets.items()],
                asynchronous=False,
            )
        except KafkaException as e:
            err: KafkaError = e.args[0]
            if err.code() in _REBALANCING:
                log.info("%s: offsets not committed (%s)", self.topic, err)
                return False
            raise Unavailable(f"{self.topic}: commit failed: {err}") from e
        return True

    def commit(self) -> None:
        """Commit what ``poll`` handed out (and dead-lettered) so far."""
        try:
            self._consumer.commit(asynchronous=False)
        except KafkaException as e:
            if e.args[0].code() != KafkaError._NO_OFFSET:
                raise Unavailable(f"{self.topic}: commit failed: {e}") from e

    def close(self) -> None:
        self._consumer.close()
