"""Growing a topic's partitions under running runs is refused: a run's partition is
murmur2(run id) mod the count, so its commands and events would split. The count
runs were placed with is recorded; a worker, a client and ``es-agents topics`` each
refuse another, with a message that says what to do."""

from __future__ import annotations

import json

import pytest
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    NewPartitions,
)
from pydantic import SecretStr

from es_agents.adapters.kafka_admin import ensure_topics
from es_agents.client import Client
from es_agents.errors import ConfigError
from es_agents.lab.demo import cli, run_worker
from es_agents.settings import KafkaSettings, Settings

pytestmark = pytest.mark.integration


def test_more_partitions_under_placed_runs_are_refused(
    env: dict[str, str], kafka_settings: KafkaSettings, database_url: str
) -> None:
    settings = Settings(kafka=kafka_settings, database_url=SecretStr(database_url))
    assert _topics(env)["partitions"] == kafka_settings.partitions  # recorded
    grown = kafka_settings.partitions + 1
    admin = AdminClient({"bootstrap.servers": kafka_settings.bootstrap_servers})
    futures = admin.create_partitions(
        [
            NewPartitions(kafka_settings.commands_topic, grown),
            NewPartitions(kafka_settings.events_topic, grown),
        ]
    )
    for future in futures.values():
        future.result(30)
    assert ensure_topics(kafka_settings)[kafka_settings.events_topic] == grown

    refused = cli(env, "topics", "-o", "json")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    error = json.loads(refused.stdout)["error"]
    assert f"runs were placed on {kafka_settings.partitions}" in error
    assert "ES_AGENTS_TOPIC_PREFIX" in error
    worker = run_worker(env, agent="tests.agents:gated")
    assert worker.returncode == 2, worker.stderr[-2000:]
    assert "runs were placed on" in worker.stderr
    with Client(settings) as client, pytest.raises(ConfigError, match="placed on"):
        client.start("research", '{"topic": "x"}')


def _topics(env: dict[str, str]) -> dict[str, object]:
    done = cli(env, "topics", "-o", "json")
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout)
    assert isinstance(rows, list)
    return dict(rows[0])
