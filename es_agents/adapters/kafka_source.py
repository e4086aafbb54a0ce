"""A consumer-group member on one Kafka topic (the ``Subscription`` port)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar, final

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from es_agents.adapters.kafka import (
    _REBALANCING,
    consume_now,
    to_record,
    where,
)
from es_agents.adapters.kafka_producer import _client
from es_agents.dead_letters import DeadLetterQueue
from es_agents.errors import DecodeError, Unavailable
from es_agents.ports import OnAssign, OnLost, OnRevoke, Received
from es_agents.settings import KafkaSettings

log = logging.getLogger(__name__)

T = TypeVar("T")


COMMIT_RETRY_SECONDS = 30.0  # a coordinator moving after a broker's loss
# A static member fenced out of its group (librdkafka's fatal consumer error) joins
# again with a new consumer -- once: fenced again within this long, it is another
# process with the same instance id, and this one leaves (crash-only).
RENEW_WINDOW_SECONDS = 60.0
_COORDINATOR_MOVING = frozenset(
    {
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.NOT_COORDINATOR,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError._TIMED_OUT,
        KafkaError._TRANSPORT,
        KafkaError._WAIT_COORD,
    }
)


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
        on_assign: OnAssign | None = None,
        on_revoke: OnRevoke | None = None,
        on_lost: OnLost | None = None,
        instance_id: str | None = None,
        gather_ms: int = 0,
    ) -> None:
        self.topic = topic
        self._decode: Callable[[bytes], T] = decode
        self._dlq = dlq
        conf = {**settings.consumer_config(group_id), "enable.partition.eof": True}
        if instance_id:
            conf["group.instance.id"] = instance_id
        if gather_ms:  # the broker answers a fetch at 64 KiB or after gather_ms
            conf["fetch.wait.max.ms"] = gather_ms
            conf["fetch.min.bytes"] = 65536
        self._cooperative = "cooperative" in str(
            conf.get("partition.assignment.strategy", "")
        )
        self._conf = _client(conf)
        self._consumer = Consumer(self._conf)
        self._owned: set[int] = set()  # partitions assigned to the current consumer
        self._renewed_at: float | None = None
        self._fatal: KafkaError | None = None  # seen; the next poll renews
        self._at_end: set[int] = set()
        self._commit_failing_since: float | None = None
        self._skipped: list[tuple[int, int]] = []
        self._on_assign = on_assign
        self._on_revoke = on_revoke
        self._on_lost = on_lost or on_revoke
        self._subscribe()
        self.dead_lettered = 0

    def _subscribe(self) -> None:
        self._consumer.subscribe(
            [self.topic],
            on_assign=self._assigned,
            on_revoke=self._revoked,
            on_lost=self._lost,
        )

    def _renew(self, err: KafkaError) -> None:
        """The consumer hit a fatal error (a static member fenced: after a
        coordinator moved, librdkafka's own rejoin can fence its earlier member
        id): its partitions are revoked, and a new consumer with the same settings
        joins the group. A second one within ``RENEW_WINDOW_SECONDS`` raises
        ``Unavailable``."""
        now = time.monotonic()
        if self._renewed_at is not None and now - self._renewed_at < (
            RENEW_WINDOW_SECONDS
        ):
            raise Unavailable(
                f"{self.topic}: fatal consumer error again within "
                f"{RENEW_WINDOW_SECONDS:.0f} s (another member with this instance "
                f"id?): {err}"
            )
        self._renewed_at = now
        log.warning("%s: %s: joining the group again", self.topic, err)
        lost, self._owned = sorted(self._owned), set()
        if lost and self._on_lost is not None:
            self._on_lost(lost)  # its commit is refused: read again, a no-op
        self._fatal = None
        old, self._consumer = self._consumer, Consumer(self._conf)
        self._at_end.clear()
        try:
            old.close()  # its callbacks are not this consumer's: left out
        except KafkaException as e:
            log.debug("%s: closing the fenced consumer: %s", self.topic, e)
        self._subscribe()

    def _assigned(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if consumer is not self._consumer:
            return  # a consumer given up (``_renew``)
        self._owned |= {p.partition for p in partitions}
        self._at_end -= {p.partition for p in partitions}
        if self._on_assign is None:
            return
        starts = self._on_assign([p.partition for p in partitions])
        if starts is None:
            return  # from the group's committed offsets
        for tp in partitions:
            tp.offset = starts.get(tp.partition, OFFSET_BEGINNING)
        if self._cooperative:
            consumer.incremental_assign(partitions)
        else:
            consumer.assign(partitions)

    def _revoked(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if consumer is not self._consumer:
            return  # a consumer given up (``_renew``): its partitions were revoked
        self._owned -= {p.partition for p in partitions}
        if self._on_revoke is not None:
            self._on_revoke([p.partition for p in partitions])

    def _lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """The session expired (no heartbeat answered within the session timeout,
        as while the group coordinator's broker is down): librdkafka joins again,
        and a static member usually gets the same partitions back."""
        if consumer is not self._consumer:
            return
        self._owned -= {p.partition for p in partitions}
        if self._on_lost is not None:
            self._on_lost([p.partition for p in partitions])

    def poll(self, timeout: float = 1.0, max_messages: int = 500) -> list[Received[T]]:
        out: list[Received[T]] = []
        if self._fatal is not None:
            self._renew(self._fatal)
        for msg in consume_now(self._consumer, max_messages, timeout):
            err = msg.error()
            if err is not None and err.code() == KafkaError._PARTITION_EOF:
                self._at_end.add(where(msg)[1])
                continue
            if err is not None:
                if err.fatal() or err.code() == KafkaError._FATAL:
                    self._renew(err)
                    return []  # read again from the committed offsets
                log.warning("%s: consumer error: %s", self.topic, err)
                continue
            self._at_end.discard(where(msg)[1])
            try:
                message = self._decode(msg.value() or b"")
            except DecodeError as e:
                self._dlq.send(to_record(msg), str(e))
                self.dead_lettered += 1
                if self._mark(msg):
                    self._skipped.append(where(msg)[1:])
                continue
            if not self._mark(msg):
                continue  # its partition was revoked in this poll: not ours now
            key = msg.key()
            raw: Any = msg.headers()
            out.append(
                Received(
                    message,
                    *where(msg),
                    key.decode(errors="replace") if isinstance(key, bytes) else key,
                    tuple((str(k), bytes(v or b"")) for k, v in raw) if raw else (),
                )
            )
        return out

    def _mark(self, msg: Message) -> bool:
        """Store the message's offset for the next commit; False when its partition
        is no longer assigned (revoked by a rebalance served in the same poll,
        after the message was fetched): the message is left to the next owner."""
        topic, partition, offset = where(msg)
        try:
            self._consumer.store_offsets(
                offsets=[TopicPartition(topic, partition, offset + 1)]
            )
        except KafkaException as e:
            if e.args[0].code() != KafkaError._STATE:
                raise
            log.info(
                "%s[%d]: revoked during the poll: offset %d left",
                topic,
                partition,
                offset,
            )
            return False
        return True

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
        routine. False too while the group's coordinator moves or loads (a broker
        of a cluster went down; a retriable error): the offsets stay pending and go
        with the next commit. Any other failure, or a retriable one that lasts
        ``COMMIT_RETRY_SECONDS``, raises ``Unavailable``: crash-only, the process
        restarts with new clients.
        """
        if self._fatal is not None:
            return False  # the consumer is given up; the next poll renews it
        try:
            self._consumer.commit(
                offsets=[TopicPartition(self.topic, p, o) for p, o in offsets.items()],
                asynchronous=False,
            )
        except KafkaException as e:
            err: KafkaError = e.args[0]
            if err.fatal() or err.code() == KafkaError._FATAL:
                log.info("%s: offsets not committed (%s)", self.topic, err)
                self._fatal = err
                return False
            if err.code() in _REBALANCING:
                log.info("%s: offsets not committed (%s)", self.topic, err)
                return False
            now = time.monotonic()
            if err.retriable() or err.code() in _COORDINATOR_MOVING:
                since = self._commit_failing_since = self._commit_failing_since or now
                if now - since < COMMIT_RETRY_SECONDS:
                    log.info("%s: offsets not committed yet (%s)", self.topic, err)
                    return False
            raise Unavailable(f"{self.topic}: commit failed: {err}") from e
        self._commit_failing_since = None
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
