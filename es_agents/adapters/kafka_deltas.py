"""The stream of model answers in flight (``Deltas``) on a Kafka topic of its own,
``<prefix>.stream``: keyed by run id, JSON values, kept an hour. It is not part of
the log: produced without waiting (acks=1 so a partition whose leader is still
settling retries rather than drops, one request in flight so a retry keeps the
order, no idempotence, 5 ms linger), and a delta that is lost is a gap in what a
watcher sees, never in the run. A follower
finds where to start by time (``offsets_for_times``), so one attaching in the
middle of a call gets what was sent of it so far."""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any, final

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka import TopicPartition as TP
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from es_agents.adapters.kafka_admin import _wait_for_leaders, list_topics
from es_agents.adapters.kafka_producer import _client
from es_agents.errors import Unavailable
from es_agents.partitioner import partition_for
from es_agents.ports import Delta
from es_agents.settings import KafkaSettings

log = logging.getLogger(__name__)

KEPT_MS = 3_600_000  # an hour: long enough to attach to any call in flight


def ensure_stream_topic(settings: KafkaSettings, timeout: float = 30.0) -> int:
    """Create ``<prefix>.stream`` when missing; its partition count."""
    admin = AdminClient(_client(settings.to_librdkafka()))
    topic = settings.stream_topic
    found = list_topics(admin, timeout).get(topic)
    if found is not None and found.error is None and found.partitions:
        return len(found.partitions)
    new = NewTopic(
        topic,
        num_partitions=settings.partitions,
        replication_factor=settings.replication_factor,
        config={"retention.ms": str(KEPT_MS), "cleanup.policy": "delete"},
    )
    try:
        admin.create_topics([new], request_timeout=timeout)[topic].result(timeout)
    except KafkaException as e:
        if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise Unavailable(f"cannot create topic {topic}: {e}") from e
    # Usable once its partitions have leaders (a piece sent before is lost).
    ready = _wait_for_leaders(
        admin, [topic], timeout, lambda: AdminClient(_client(settings.to_librdkafka()))
    )
    return len(ready[topic].partitions)


def encode(delta: Delta) -> bytes:
    return json.dumps(
        [delta.step, delta.attempt, delta.kind, delta.text, delta.sent_at],
        separators=(",", ":"),
        ensure_ascii=False,
    ).encode()


def decode(run_id: str, value: bytes) -> Delta | None:
    try:
        step, attempt, kind, text, sent_at = json.loads(value)
        return Delta(run_id, int(step), int(attempt), kind, str(text), float(sent_at))
    except (ValueError, TypeError):
        return None  # not ours: someone else wrote to the topic


def _start(consumer: Consumer, topic: str, partition: int, since: datetime) -> int:
    """The first offset at or after ``since``; when there is none yet, the end as
    it was *before* asking (what lands between the two answers is at or after
    it: asked the other way round, a delta landing in between was passed over)."""
    end: int = consumer.get_watermark_offsets(TP(topic, partition), timeout=10)[1]
    wanted = TP(topic, partition, int(since.timestamp() * 1000))
    start: int = consumer.offsets_for_times([wanted], timeout=10)[0].offset
    return start if start >= 0 else end


_SETTLING = {
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
}


def _settled(ask: Callable[[], int], seconds: float = 15.0) -> int:
    """``ask`` again while the partition's leader is settling (a fresh topic, a
    leader change): the broker answers NOT_LEADER until it is."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return ask()
        except KafkaException as e:
            if e.args[0].code() not in _SETTLING or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@final
class KafkaDeltas:
    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings
        self.topic = settings.stream_topic
        self._lock = threading.Lock()
        self._producer: Producer | None = None
        self._partitions: int | None = None

    def _count(self) -> int:
        with self._lock:
            if self._partitions is None:
                self._partitions = ensure_stream_topic(self.settings)
            return self._partitions

    def publish(self, delta: Delta) -> None:
        """Queued for sending, never waited for (the topic is made with the others,
        ``ensure_stream_topic``: nothing here asks the broker anything)."""
        producer = self._producer
        if producer is None:
            with self._lock:
                if self._producer is None:
                    self._producer = Producer(
                        _client(
                            {
                                **self.settings.to_librdkafka(),
                                # Nobody waits for a delta's acknowledgement,
                                # but the leader gives one: with acks=0 a broker
                                # that is not (yet) the leader drops it silently.
                                "acks": 1,
                                "enable.idempotence": False,
                                "max.in.flight.requests.per.connection": 1,
                                "linger.ms": 5,
                                "message.timeout.ms": 10_000,
                                "partitioner": "murmur2_random",
                            }
                        )
                    )
                producer = self._producer
        try:
            producer.produce(self.topic, encode(delta), delta.run_id.encode())
        except (BufferError, KafkaException) as e:  # a gap for watchers, not the run
            log.debug("run %s: a delta was not sent: %s", delta.run_id, e)
        producer.poll(0)

    def follow(
        self, run_id: str, since: datetime, stop: Callable[[], bool]
    ) -> Iterator[Delta]:
        partition = partition_for(run_id, self._count())
        conf: dict[str, Any] = {
            **self.settings.to_librdkafka(),
            "group.id": f"{self.settings.topic_prefix}.stream-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "latest",
            "fetch.wait.max.ms": 10,
            "enable.partition.eof": False,
        }
        consumer = Consumer(_client(conf))
        key = run_id.encode()
        try:
            start = _settled(lambda: _start(consumer, self.topic, partition, since))
            consumer.assign([TP(self.topic, partition, start)])
            while True:
                # One message as soon as it comes (consume(n) would wait for n or
                # the timeout), then whatever else is already here.
                msgs = consumer.consume(1, timeout=0.1)
                if msgs:
                    msgs += consumer.consume(500, timeout=0)
                for msg in msgs:
                    if msg.error() is not None or msg.key() != key:
                        continue
                    delta = decode(run_id, msg.value() or b"")
                    if delta is not None:
                        yield delta
                if not msgs and stop():
                    return
        finally:
            consumer.close()

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(2)
