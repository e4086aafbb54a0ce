"""A commit refused while the group's coordinator moves (a broker of a cluster went
down) leaves the offsets pending for the next commit instead of stopping the worker;
one that keeps failing past ``COMMIT_RETRY_SECONDS``, or any other failure, raises
``Unavailable`` (crash-only)."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from es_agents.adapters import kafka_source
from es_agents.adapters.kafka_source import KafkaSource
from es_agents.errors import Unavailable
from es_agents.settings import KafkaSettings


class _Refusing:
    """A consumer whose commits fail with ``code`` while ``failing``."""

    def __init__(self, code: int) -> None:
        self.code = code
        self.failing = True
        self.committed: list[Any] = []

    def commit(self, offsets: Any, asynchronous: bool) -> None:
        if self.failing:
            raise KafkaException(KafkaError(self.code))
        self.committed.append(offsets)


def _source(consumer: _Refusing) -> KafkaSource[bytes]:
    settings = KafkaSettings(bootstrap_servers="127.0.0.1:9", topic_prefix="t")
    source: KafkaSource[bytes] = KafkaSource(
        settings,
        settings.commands_topic,
        "g",
        bytes,
        dlq=None,  # type: ignore[arg-type]
    )
    source._consumer.close()
    source._consumer = consumer  # type: ignore[assignment]
    return source


def test_a_moving_coordinator_leaves_the_offsets_pending() -> None:
    consumer = _Refusing(KafkaError.COORDINATOR_LOAD_IN_PROGRESS)
    source = _source(consumer)
    assert source.commit_offsets({0: 5}) is False  # pending, not a crash
    assert source.commit_offsets({0: 7}) is False
    consumer.failing = False
    assert source.commit_offsets({0: 7}) is True
    assert [tp.offset for tp in consumer.committed[0]] == [7]


def test_a_coordinator_gone_for_too_long_is_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    source = _source(_Refusing(KafkaError.NOT_COORDINATOR))
    assert source.commit_offsets({0: 5}) is False
    monkeypatch.setattr(kafka_source, "COMMIT_RETRY_SECONDS", 0.0)
    with pytest.raises(Unavailable, match="commit failed"):
        source.commit_offsets({0: 5})


def test_another_commit_failure_is_unavailable_at_once() -> None:
    source = _source(_Refusing(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    with pytest.raises(Unavailable, match="commit failed"):
        source.commit_offsets({0: 5})
