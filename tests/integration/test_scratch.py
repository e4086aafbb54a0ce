"""A bench's scratch topics and database exist while it runs and are gone after it:
a broker that kept every bench's and test's topics grew slower to start with each."""

from __future__ import annotations

import psycopg
import pytest
from confluent_kafka.admin import AdminClient
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from es_agents.adapters.kafka_admin import delete_topics
from es_agents.lab.bench import scratch_settings
from es_agents.settings import KafkaSettings
from tests.integration.test_commands import until

pytestmark = pytest.mark.integration


def _topics(kafka: KafkaSettings) -> set[str]:
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    return {
        t
        for t in admin.list_topics(timeout=10).topics
        if t.startswith(kafka.topic_prefix + ".")
    }


def _database_exists(url: str) -> bool:
    name = conninfo_to_dict(url)["dbname"]
    with psycopg.connect(make_conninfo(url, dbname="postgres")) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_database WHERE datname = %s", (name,)
        ).fetchone()
    return bool(row and row[0])


def test_a_bench_leaves_neither_topics_nor_a_database(dev_stack: object) -> None:
    with scratch_settings(partitions=1) as settings:
        kafka = settings.kafka
        url = settings.database_url.get_secret_value()
        assert _topics(kafka) == {
            kafka.commands_topic,
            kafka.events_topic,
            kafka.dlq_topic,
            kafka.stream_topic,  # the answers' stream, made with the others
        }
        assert _database_exists(url)
    # Deleted when the bench ends; the broker's metadata may take a moment to say so.
    until(lambda: _topics(kafka) == set(), 10, "the bench's topics deleted")
    assert not _database_exists(url)


def test_deleting_a_prefixs_topics_twice(kafka_settings: KafkaSettings) -> None:
    """What the tests' fixture does after each test: the second time there is
    nothing left to delete, and that is not a failure."""
    assert len(_topics(kafka_settings)) == 3
    assert delete_topics(kafka_settings) == []
    until(lambda: _topics(kafka_settings) == set(), 10, "the topics deleted")
    assert delete_topics(kafka_settings) == []
