"""The process's idempotent Kafka producers, with acknowledgements as futures (one
record) or as one countdown (a batch), each served by a thread of its own that polls
librdkafka's delivery reports; and the librdkafka settings every client of ours gets
(errors and logs into Python logging).

Two producers: one sends each record at once (a lone run's step, commands, claims);
the other lingers ``batch_linger_ms`` and carries batches of several runs' steps. With
one producer sending at once, each record of a batch woke librdkafka's broker thread,
and the call waited on its locks with the GIL held (29-46 us of wall per record
under load, against 6 us alone)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, final

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from es_agents.errors import AppendError, ConfigError, Unavailable
from es_agents.ports import Position
from es_agents.settings import KafkaSettings

log = logging.getLogger(__name__)

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


# A batch of at least this many records (the steps of two runs or more) goes through
# the batch producer; fewer (a lone run's step) through the one that sends at once.
_BATCH_RECORDS = 4

# A record to produce: key, value, headers.
Record3 = tuple[str | None, bytes, list[tuple[str, str | bytes | None]]]


@final
class _Acks:
    """The acknowledgements of one batch, counted down by delivery reports (on the
    poller thread, or on a producing thread that polls while the queue is full)."""

    def __init__(
        self,
        count: int,
        where: str,
        then: Callable[[list[Position], Exception | None], None] | None = None,
    ) -> None:
        self.positions: list[Position] = []  # in the order acknowledged
        self.error: AppendError | None = None
        self.done = threading.Event()
        self._where = where
        self._then = then
        self._left = count
        self._lock = threading.Lock()
        if count == 0:
            self._finish()

    def _finish(self) -> None:
        self.done.set()
        if self._then is not None:
            self._then(self.positions, self.error)

    def delivered(self, err: KafkaError | None, msg: Message) -> None:
        """The delivery report of one record of the batch (one bound method for
        them all). Must never raise: no later acknowledgement would be served."""
        if err is not None:
            self.error = AppendError(f"{self._where}: not acknowledged: {err}")
        else:  # an offset may be unknown after a retry across a restart (-1)
            offset, partition = msg.offset(), msg.partition()
            self.positions.append(
                Position(
                    msg.topic() or "",
                    partition if partition is not None else -1,
                    offset if offset is not None else -1,
                )
            )
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:
            self._finish()


@final
class KafkaProducerLink:
    """The process's producers (one sending at once, one for batches), with futures
    for acknowledgements."""

    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings
        self._producer = Producer(_client(settings.producer_config()))
        self._closed = threading.Event()
        self._pollers = [
            threading.Thread(
                target=self._poll,
                args=(self._producer,),
                name="es-kafka-acks",
                daemon=True,
            )
        ]
        self._batcher: Producer | None = None
        if settings.batch_linger_ms > 0:
            self._batcher = Producer(
                _client(
                    {
                        **settings.producer_config(),
                        "linger.ms": settings.batch_linger_ms,
                    }
                )
            )
            self._pollers.append(
                threading.Thread(
                    target=self._poll,
                    args=(self._batcher,),
                    name="es-kafka-batch-acks",
                    daemon=True,
                )
            )
        for poller in self._pollers:
            poller.start()

    def _poll(self, producer: Producer) -> None:
        while not self._closed.is_set():
            producer.poll(0.05)

    def produce(
        self,
        topic: str,
        key: str | None,
        value: bytes,
        headers: list[tuple[str, str | bytes | None]] | None = None,
        partition: int | None = None,
    ) -> Future[Position]:
        """Hand one record to the producer; the future completes with its position
        once the broker acknowledged it. ``partition``: a fixed partition (a claim
        has no key to hash)."""
        future: Future[Position] = Future()

        def delivered(err: KafkaError | None, msg: Message) -> None:
            # Runs on the poller thread: it must never raise, or no later
            # acknowledgement would be served.
            if err is not None:
                future.set_exception(
                    AppendError(f"{topic} key {key}: not acknowledged: {err}")
                )
                return
            # An acknowledgement of a batch retried across a broker restart may
            # come without its offset (librdkafka reports it invalid): durable,
            # position unknown (-1).
            offset = msg.offset()
            partition = msg.partition()
            future.set_result(
                Position(
                    topic,
                    partition if partition is not None else -1,
                    offset if offset is not None else -1,
                )
            )

        self._produce(topic, key, value, headers, partition, delivered)
        return future

    def append_all(
        self,
        topic: str,
        partition: int,
        records: Sequence[Record3],
    ) -> list[Position]:
        """Hand ``records`` (key, value, headers) to the producer for one partition
        and block until every one is acknowledged: one countdown for the batch, not
        a future per record (a batch of a hundred runs' steps is the usual case)."""
        acks = self._send(topic, partition, records, None)
        timeout = self.settings.delivery_timeout_ms / 1000 + 5
        if not acks.done.wait(timeout):
            raise AppendError(f"no acknowledgement within {timeout:.0f}s")
        if acks.error is not None:
            raise acks.error
        return acks.positions

    def submit_all(
        self,
        topic: str,
        partition: int,
        records: Sequence[Record3],
        then: Callable[[list[Position], Exception | None], None],
    ) -> None:
        """``append_all`` without blocking: ``then(positions, error)`` runs on the
        poller thread once every record is acknowledged (or one failed)."""
        self._send(topic, partition, records, then)

    def _send(
        self,
        topic: str,
        partition: int,
        records: Sequence[Record3],
        then: Callable[[list[Position], Exception | None], None] | None,
    ) -> _Acks:
        acks = _Acks(len(records), f"{topic}[{partition}]", then)
        producer = (
            self._batcher
            if self._batcher is not None and len(records) >= _BATCH_RECORDS
            else self._producer
        )
        for key, value, headers in records:
            self._produce(
                topic, key, value, headers, partition, acks.delivered, producer
            )
        return acks

    def _produce(  # noqa: PLR0917 - librdkafka's produce, one place
        self,
        topic: str,
        key: str | None,
        value: bytes,
        headers: list[tuple[str, str | bytes | None]] | None,
        partition: int | None,
        delivered: Callable[[KafkaError | None, Message], None],
        producer: Producer | None = None,
    ) -> None:
        """Hand one record to librdkafka (``partition`` None: the partitioner's
        choice by key), waiting while its local queue is full."""
        producer = producer or self._producer
        while True:
            try:
                producer.produce(
                    topic,
                    value=value,
                    key=key,
                    headers=headers,
                    # -1: unassigned, librdkafka's partitioner picks it by key
                    partition=-1 if partition is None else partition,
                    on_delivery=delivered,
                )
            except BufferError:
                # The local queue is full: wait for acknowledgements to drain it.
                producer.poll(0.01)
            except KafkaException as e:
                raise AppendError(f"{topic} key {key}: cannot produce: {e}") from e
            else:
                return

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
        if self._batcher is not None:
            self._batcher.flush(self.settings.delivery_timeout_ms / 1000)
        self._closed.set()
        for poller in self._pollers:
            poller.join()
