"""A bare reader of the events topic, no framework: what reading the log costs by
itself, for ratios (``audit``, ``bench audit``)."""

from __future__ import annotations

import time
import uuid

import psycopg
from confluent_kafka import Consumer, KafkaError, TopicPartition

from es_agents.settings import Settings


def bare_read(settings: Settings, partitions: int) -> tuple[int, float]:
    """(records, seconds) to read every record of the events topic once."""
    topic = settings.kafka.events_topic
    started = time.perf_counter()
    if settings.store == "postgres":
        count = 0
        with (
            psycopg.connect(settings.database_url.get_secret_value()) as conn,
            conn.cursor(name="bare") as cur,
        ):
            cur.itersize = 5000
            cur.execute("SELECT value FROM log_records WHERE topic = %s", (topic,))
            for _ in cur:
                count += 1
        return count, time.perf_counter() - started
    consumer = Consumer(
        {
            "bootstrap.servers": settings.kafka.bootstrap_servers,
            "group.id": f"bare-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    count = 0
    at_end: set[int] = set()
    try:
        while len(at_end) < partitions:
            for msg in consumer.consume(5000, timeout=1.0):
                err = msg.error()
                if err is None:
                    count += 1
                elif err.code() == KafkaError._PARTITION_EOF:
                    at_end.add(msg.partition() or 0)
    finally:
        consumer.close()
    return count, time.perf_counter() - started
