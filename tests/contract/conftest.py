"""The contract suites run each port's promises against every store: memory (in the
unit run, no services), Kafka and Postgres (integration, the real servers)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from pydantic import SecretStr

from es_agents.app import build_ports
from es_agents.ports import Ports
from es_agents.settings import KafkaSettings, Settings

STORES = [
    pytest.param("memory", id="memory"),
    pytest.param("kafka", id="kafka", marks=pytest.mark.integration),
    pytest.param("postgres", id="postgres", marks=pytest.mark.integration),
]


@pytest.fixture(params=STORES)
def settings(request: pytest.FixtureRequest) -> Iterator[Settings]:
    store = request.param
    if store == "memory":
        kafka = KafkaSettings(topic_prefix=f"mem-{uuid.uuid4().hex[:8]}", partitions=3)
        yield Settings(kafka=kafka, store="memory", payloads="off")
        return
    from es_agents.dev import DevStack  # noqa: PLC0415

    stack = request.getfixturevalue("dev_stack")
    assert isinstance(stack, DevStack)
    kafka = request.getfixturevalue("kafka_settings")
    name = f"es_contract_{uuid.uuid4().hex[:10]}"
    stack.postgres.create_database(name)
    url = stack.dev.database_url.rsplit("/", 1)[0] + f"/{name}"
    try:
        yield Settings(
            kafka=kafka.model_copy(update={"session_timeout_ms": 6000}),
            database_url=SecretStr(url),
            store=store,
            payloads="off",
        )
    finally:
        stack.postgres.drop_database(name)


@pytest.fixture
def ports(settings: Settings) -> Iterator[Ports]:
    built = build_ports(settings)
    built.ensure_topics()
    try:
        yield built
    finally:
        built.close()
