"""Shared fixtures. Integration tests run against the real stack that `dev up` starts.

Every test session gets its own topic prefix and database, so reruns never collide.
A missing service fails the session; nothing is skipped.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Iterator

import pytest

from es_agents.settings import KafkaSettings

SESSION = uuid.uuid4().hex[:8]


@pytest.fixture(scope="session")
def dev_stack() -> object:
    from es_agents.dev import DevStack  # noqa: PLC0415

    stack = DevStack()
    stack.up(log=lambda _line: None)
    return stack


@pytest.fixture(scope="session")
def database_url(dev_stack: object) -> Iterator[str]:
    from es_agents.dev import DevStack  # noqa: PLC0415

    assert isinstance(dev_stack, DevStack)
    from es_agents.adapters.postgres import Database  # noqa: PLC0415

    name = f"es_test_{SESSION}"
    dev_stack.postgres.create_database(name)
    url = dev_stack.dev.database_url.rsplit("/", 1)[0] + f"/{name}"
    # Migrated now, not by whichever test happens to run first in this process
    # (tests run in several processes, each with its own session database).
    db = Database(url, max_size=1)
    try:
        db.migrate()
    finally:
        db.close()
    yield url
    dev_stack.postgres.drop_database(name)


@pytest.fixture
def kafka_settings(
    dev_stack: object, request: pytest.FixtureRequest
) -> Iterator[KafkaSettings]:
    """Settings with a topic prefix unique to this test (and this session); its
    topics are deleted after the test (a broker keeping every test's topics grows
    slower to start with each `make test`)."""
    from es_agents.adapters.kafka_admin import delete_topics, ensure_topics  # noqa: PLC0415
    from es_agents.dev import DevStack  # noqa: PLC0415

    assert isinstance(dev_stack, DevStack)
    full = request.node.name
    digest = hashlib.sha256(full.encode()).hexdigest()[:6]
    name = full.replace("[", "-").replace("]", "")[:50] + "-" + digest
    replicas, min_isr = dev_stack.dev.replication  # a cluster: replicated topics
    settings = KafkaSettings(
        bootstrap_servers=dev_stack.dev.kafka_bootstrap,
        topic_prefix=f"t{SESSION}.{name}",
        partitions=int(os.environ.get("ES_AGENTS_TEST_PARTITIONS", "3")),
        replication_factor=replicas,
        min_insync_replicas=min_isr,
    )
    ensure_topics(settings)
    yield settings
    delete_topics(settings, timeout=10)
