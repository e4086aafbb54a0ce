"""Fixtures shared by the runtime tests: the ticketing service and worker settings."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from es_agents.lab.demo import ticket_service
from es_agents.settings import KafkaSettings


@pytest.fixture(scope="session")
def tickets_url(database_url: str) -> Iterator[str]:
    # One service per test process (pytest-xdist names them gw0, gw1, ...).
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    with ticket_service(database_url, port=18081 + int(worker[2:] or 0)) as url:
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
