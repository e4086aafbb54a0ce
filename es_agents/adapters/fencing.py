"""Fencing by Kafka transactions (``ES_AGENTS_FENCING=transactions``; the default is
epochs in the log, ``kafka_epochs``): one transactional producer per owned partition.

``transactional.id`` is derived from the consumer group and the partition, so the
worker that gains a partition calls ``init_transactions()`` with the same id as the
one that lost it: the broker bumps the producer epoch and rejects every later
transaction of the old owner (a zombie paused past its session timeout). Readers are
read_committed, so nothing a fenced writer produced is ever read.

Each partition has one writer thread that commits whatever runs queued since the last
commit in one transaction (group commit): one transaction per step when a run is
alone, and fewer than one per step when many runs share the partition. Transactions
last milliseconds and are never held across a model or tool call.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, final

from confluent_kafka import KafkaError, KafkaException, Producer

from es_agents.adapters.kafka_producer import _client
from es_agents.codec import AvroCodec
from es_agents.core.chain import Sealed
from es_agents.errors import AppendError, FencedError
from es_agents.settings import KafkaSettings

log = logging.getLogger(__name__)

_Request = tuple[list[tuple[str, bytes, list[tuple[str, bytes]]]], Future[None]]


@final
class PartitionWriter:
    def __init__(
        self,
        settings: KafkaSettings,
        codec: AvroCodec,
        group: str,
        partition: int,
        epoch: int = 0,
    ) -> None:
        self.topic = settings.events_topic
        self.partition = partition
        self.epoch = epoch  # the fencing token tools get
        self.codec = codec
        conf = {
            **settings.producer_config(),
            "transactional.id": f"{group}.p{partition}",
            # A transaction lives for one commit; a hung one is aborted by the
            # broker quickly (librdkafka has no KIP-890, so EndTxn can hang).
            "transaction.timeout.ms": 10_000,
            "message.timeout.ms": 10_000,
        }
        self._producer = Producer(_client(conf))
        try:
            self._producer.init_transactions(30)  # fences the previous owner
        except KafkaException as e:
            raise AppendError(
                f"{self.topic}[{partition}]: init_transactions: {e}"
            ) from e
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self._fenced = False
        self._closed = False
        # The offset after the last record this writer committed. A commit returns
        # before the broker has written the commit markers, so until they are, a
        # read_committed reader stops short of it: a run loaded right after its own
        # commit must read at least this far (read your writes).
        self.committed_end = 0
        self._thread = threading.Thread(
            target=self._run, daemon=True, name=f"es-writer-p{partition}"
        )
        self._thread.start()

    def append(self, records: Sequence[Sealed]) -> None:
        """Return once the records are committed; raise FencedError if fenced."""
        if self._fenced or self._closed:
            raise FencedError(
                f"{self.topic}[{self.partition}]: this writer was "
                + ("fenced" if self._fenced else "closed: the partition was revoked")
            )
        future: Future[None] = Future()
        self._queue.put(
            ([(r.event.run_id, r.value, list(r.headers)) for r in records], future)
        )
        future.result()

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            while True:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._queue.put(None)
                    break
                batch.append(more)
            error = self._commit([r for records, _ in batch for r in records])
            for _, future in batch:
                if error is None:
                    future.set_result(None)
                else:
                    future.set_exception(error)

    def _commit(
        self, records: list[tuple[str, bytes, list[tuple[str, bytes]]]]
    ) -> Exception | None:
        if self._fenced:
            return FencedError(f"{self.topic}[{self.partition}]: fenced")
        offsets: list[int] = []

        def delivered(err: KafkaError | None, msg: Any) -> None:
            if err is None and msg.offset() is not None:
                offsets.append(msg.offset())

        try:
            self._producer.begin_transaction()
            for key, value, headers in records:
                self._produce(key, value, headers, delivered)
            self._producer.commit_transaction(30)  # flushes: serves `delivered`
        except KafkaException as e:
            err: KafkaError = e.args[0]
            if err.fatal() or err.code() in (
                KafkaError._FENCED,
                KafkaError.PRODUCER_FENCED,
                KafkaError.INVALID_PRODUCER_EPOCH,
            ):
                self._fenced = True
                log.warning("%s[%d]: fenced: %s", self.topic, self.partition, err)
                return FencedError(f"{self.topic}[{self.partition}]: fenced: {err}")
            if err.txn_requires_abort():
                try:
                    self._producer.abort_transaction(30)
                except KafkaException as abort_error:
                    log.warning("abort failed: %s", abort_error)
            return AppendError(f"{self.topic}[{self.partition}]: not committed: {err}")
        if offsets:
            self.committed_end = max(self.committed_end, max(offsets) + 1)
        return None

    def _produce(
        self,
        key: str,
        value: bytes,
        headers: list[tuple[str, bytes]],
        delivered: Callable[[Any, Any], None],
    ) -> None:
        while True:
            try:
                self._producer.produce(
                    self.topic,
                    key=key,
                    value=value,
                    headers=list[tuple[str, str | bytes | None]](headers) or None,
                    partition=self.partition,
                    on_delivery=delivered,
                )
            except BufferError:
                self._producer.poll(0.01)
            else:
                return

    def close(self) -> None:
        self._closed = True
        self._queue.put(None)
        self._thread.join(30)
        self._producer.flush(5)
