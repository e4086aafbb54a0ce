"""`es-agents demo` ends by itself, with exit code 0 only when every check holds,
on the Kafka store and on the Postgres store."""

from __future__ import annotations

import pytest

from es_agents.lab.demo import cli
from es_agents.settings import KafkaSettings

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("store", ["kafka", "postgres"])
def test_demo_passes_its_checks(
    store: str, kafka_settings: KafkaSettings, database_url: str
) -> None:
    env = {
        "ES_AGENTS_STORE": store,
        # The Postgres store needs no broker: a wrong address proves it.
        "ES_AGENTS_BOOTSTRAP_SERVERS": kafka_settings.bootstrap_servers
        if store == "kafka"
        else "127.0.0.1:1",
        "ES_AGENTS_TOPIC_PREFIX": kafka_settings.topic_prefix,
        "ES_AGENTS_PARTITIONS": str(kafka_settings.partitions),
        "ES_AGENTS_DATABASE_URL": database_url,
    }
    result = cli(env, "demo")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[FAIL]" not in result.stdout
    assert result.stdout.count("[ok]") == 8
    assert "tickets for the run: 1 (one per key)" in result.stdout
    assert f"({store} store)" in result.stdout
