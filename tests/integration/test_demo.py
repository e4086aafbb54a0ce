"""`es-agents demo` ends by itself, with exit code 0 only when every check holds, on
the Kafka store and on the Postgres store — one after the other on one database, in
either order, with a projector run between them: a topic prefix belongs to one store,
and the two stores' defaults differ."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from es_agents.lab.demo import cli
from es_agents.settings import KafkaSettings, Settings

pytestmark = pytest.mark.integration


@pytest.fixture
def fresh_database(dev_stack: object) -> Iterator[str]:
    """A database of this test's own: the stores' default prefixes are used in it."""
    from es_agents.dev import DevStack  # noqa: PLC0415

    assert isinstance(dev_stack, DevStack)
    name = f"es_demo_{uuid.uuid4().hex[:8]}"
    dev_stack.postgres.create_database(name)
    yield dev_stack.dev.database_url.rsplit("/", 1)[0] + f"/{name}"
    dev_stack.postgres.drop_database(name)


def _env(store: str, kafka: KafkaSettings, database_url: str) -> dict[str, str]:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    env = {
        "ES_AGENTS_STORE": store,
        "ES_AGENTS_BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
        "ES_AGENTS_PARTITIONS": str(kafka.partitions),
        "ES_AGENTS_DATABASE_URL": database_url,
        "ES_AGENTS_DEMO_TICKETS_PORT": str(18090 + int(worker[2:] or 0)),
    }
    if store == "kafka":
        # The broker is shared: the Kafka store gets this test's own prefix. The
        # Postgres store keeps its default: its log lives in this test's database.
        env["ES_AGENTS_TOPIC_PREFIX"] = kafka.topic_prefix
    return env


def _demo(store: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    result = cli(env, "demo")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[FAIL]" not in result.stdout
    assert result.stdout.count("[ok]") == 8
    assert "tickets for the run: 1 (one per key)" in result.stdout
    assert f"({store} store)" in result.stdout
    return result


def test_the_stores_default_to_different_prefixes() -> None:
    kafka, postgres = Settings(store="kafka"), Settings(store="postgres")
    assert kafka.kafka.topic_prefix != postgres.kafka.topic_prefix
    assert kafka.projector_group_id != postgres.projector_group_id


@pytest.mark.parametrize("order", [("kafka", "postgres"), ("postgres", "kafka")])
def test_both_demos_on_one_database_in_either_order(
    order: tuple[str, str],
    kafka_settings: KafkaSettings,
    fresh_database: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("ES_AGENTS_TOPIC_PREFIX", raising=False)
    # The default: the writer key kept in the database, made by the first worker.
    monkeypatch.delenv("ES_AGENTS_WRITER_KEY", raising=False)
    first, second = order
    _demo(first, _env(first, kafka_settings, fresh_database))
    # What a user following the audit section does between the two.
    projected = cli(
        _env(first, kafka_settings, fresh_database), "projector", "--until-caught-up"
    )
    assert projected.returncode == 0, projected.stderr
    assert "projected 14 events" in projected.stdout + projected.stderr
    _demo(second, _env(second, kafka_settings, fresh_database))
    projected = cli(
        _env(second, kafka_settings, fresh_database), "projector", "--until-caught-up"
    )
    assert projected.returncode == 0, projected.stderr
    assert "projected 14 events" in projected.stdout + projected.stderr
    # Both stores' runs are listed from the one database.
    listed = cli(_env(second, kafka_settings, fresh_database), "runs", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.count('"completed"') >= 2, listed.stdout


def test_a_prefix_of_one_store_is_refused_by_the_other(
    kafka_settings: KafkaSettings, fresh_database: str
) -> None:
    """The sequence that hid the Postgres store's runs (the same prefix and database
    on both stores, a projector between) is refused with one line that says what to
    do, by every command that touches the prefix, before anything is written."""
    kafka_env = _env("kafka", kafka_settings, fresh_database)
    _demo("kafka", kafka_env)
    assert cli(kafka_env, "projector", "--until-caught-up").returncode == 0
    same_prefix = {
        **_env("postgres", kafka_settings, fresh_database),
        "ES_AGENTS_TOPIC_PREFIX": kafka_settings.topic_prefix,
    }
    for args in (
        ("demo",),
        ("worker", "--agent", "es_agents.lab.research:agent", "--until-idle"),
        ("projector", "--until-caught-up"),
        ("start", "research", "--input", "{}"),
    ):
        refused = cli(same_prefix, *args)
        assert refused.returncode != 0, (args, refused.stdout)
        message = refused.stdout + refused.stderr
        assert f"topic prefix '{kafka_settings.topic_prefix}'" in message, message
        assert "belongs to the kafka store" in message, message
        assert "ES_AGENTS_TOPIC_PREFIX" in message, message
    # The Postgres store wrote nothing under the Kafka store's prefix.
    from es_agents.adapters.postgres import Database  # noqa: PLC0415

    db = Database(fresh_database, max_size=1)
    try:
        with db.transaction() as conn:
            rows = conn.execute(
                "SELECT count(*) FROM log_records WHERE topic LIKE %s",
                (f"{kafka_settings.topic_prefix}.%",),
            ).fetchone()
    finally:
        db.close()
    assert rows is not None
    assert rows[0] == 0
