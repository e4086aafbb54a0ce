"""The process's producer against the real broker: a lone run's step goes through
the producer that sends at once, a batch of several runs' steps through the one that
lingers; appends one after the other keep the partition's order whichever carried
them, and every record is acknowledged with its position."""

from __future__ import annotations

import threading

import pytest
from confluent_kafka import Consumer, TopicPartition

from es_agents.adapters.kafka_producer import KafkaProducerLink, Record3
from es_agents.ports import Position
from es_agents.settings import KafkaSettings

pytestmark = pytest.mark.integration


def _submit(
    link: KafkaProducerLink, topic: str, records: list[Record3]
) -> list[Position]:
    done = threading.Event()
    got: list[list[Position]] = []
    errors: list[Exception] = []

    def then(positions: list[Position], error: Exception | None) -> None:
        if error is not None:
            errors.append(error)
        got.append(positions)
        done.set()

    link.submit_all(topic, 0, records, then)
    assert done.wait(30), "no acknowledgement within 30 s"
    assert not errors, errors
    return got[0]


@pytest.mark.parametrize("linger", [0.0, 5.0])
def test_appends_of_any_size_keep_the_partitions_order(
    kafka_settings: KafkaSettings, linger: float
) -> None:
    settings = kafka_settings.model_copy(update={"batch_linger_ms": linger})
    topic = settings.events_topic
    link = KafkaProducerLink(settings)
    sent: list[bytes] = []
    try:
        for size in [1, 2, 7, 1, 4, 3, 12, 2, 5]:  # below and above a batch's size
            records: list[Record3] = []
            for _ in range(size):
                value = f"r{len(sent)}".encode()
                sent.append(value)
                records.append((f"run-{len(sent) % 3}", value, [("h", b"v")]))
            if size % 2:
                positions = _submit(link, topic, records)
            else:
                positions = link.append_all(topic, 0, records)
            assert len(positions) == size
            assert all(p.partition == 0 and p.offset >= 0 for p in positions)
    finally:
        link.close()

    consumer = Consumer(
        {
            "bootstrap.servers": settings.bootstrap_servers,
            "group.id": "order-check",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    read: list[bytes] = []
    try:
        while len(read) < len(sent):
            msgs = consumer.consume(100, timeout=10)
            assert msgs, f"read {len(read)} of {len(sent)} records"
            read += [m.value() or b"" for m in msgs if m.error() is None]
    finally:
        consumer.close()
    assert read == sent
