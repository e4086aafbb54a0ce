"""Fixtures shared by the runtime tests: the ticketing service and worker settings."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from es_agents.lab.demo import ticket_service
from es_agents.settings import KafkaSettings


@pytest.fixture(scope="session")
def tickets_url(database_url: str) -> Iterator[str]:
    with ticket_service(database_url, port=18081) as url:
        yield url


@pytest.fixture
def env(
    kafka_settings: KafkaSettings, database_url: str, tickets_url: str, tmp_path: Path
) -> dict[str, str]:
    return {
        "ES_AGENTS_BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers,
        "ES_AGENTS_REPLICATION_FACTOR": str(kafka_settings.replication_factor),
        "ES_AGENTS_MIN_INSYNC_REPLICAS": str(kafka_settings.min_insync_replicas),
        "ES_AGENTS_TOPIC_PREFIX": kafka_settings.topic_prefix,
        "ES_AGENTS_PARTITIONS": str(kafka_settings.partitions),
        "ES_AGENTS_DATABASE_URL": database_url,
        "ES_AGENTS_TICKETS_URL": tickets_url,
        "ES_AGENTS_MODEL_CALLS_LOG": str(tmp_path / "model-calls.jsonl"),
    }
