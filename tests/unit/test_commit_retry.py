"""A commit refused while the group's coordinator moves (a broker of a cluster went
down) leaves the offsets pending for the next commit instead of stopping the worker;
one that keeps failing past ``COMMIT_RETRY_SECONDS``, or any other failure, raises
``Unavailable`` (crash-only). A message whose partition a rebalance revoked in the
same poll is left to the partition's next owner, not a crash."""

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


class _Msg:
    def __init__(self, partition: int, offset: int) -> None:
        self._where = ("t.commands", partition, offset)

    def topic(self) -> str:
        return self._where[0]

    def partition(self) -> int:
        return self._where[1]

    def offset(self) -> int:
        return self._where[2]

    def error(self) -> None:
        return None

    def value(self) -> bytes:
        return b"x"

    def key(self) -> bytes:
        return b"run-1"

    def headers(self) -> None:
        return None


class _Revoking(_Refusing):
    """A consumer that fetched messages of partitions 0 and 1, then served a
    rebalance that revoked partition 1 in the same poll: storing an offset of
    partition 1 is refused with librdkafka's ``_STATE``."""

    def __init__(self) -> None:
        super().__init__(KafkaError.NO_ERROR)
        self.batches = [[_Msg(0, 3), _Msg(1, 8), _Msg(0, 4)]]
        self.stored: list[tuple[int, int]] = []

    def consume(self, num_messages: int, timeout: float) -> list[_Msg]:
        return self.batches.pop(0) if self.batches else []

    def store_offsets(self, offsets: Any) -> None:
        for tp in offsets:
            if tp.partition == 1:
                raise KafkaException(KafkaError(KafkaError._STATE))
            self.stored.append((tp.partition, tp.offset))


def test_a_message_of_a_partition_revoked_in_the_same_poll_is_left() -> None:
    """It is not handed on (its partition's next owner reads it) and the worker
    does not crash; the other partition's messages are served."""
    consumer = _Revoking()
    source = _source(consumer)
    got = source.poll(timeout=0.01)
    assert [(m.partition, m.offset) for m in got] == [(0, 3), (0, 4)]
    assert consumer.stored == [(0, 4), (0, 5)]


def test_another_store_failure_still_raises() -> None:
    consumer = _Revoking()

    def refuse(offsets: Any) -> None:
        raise KafkaException(KafkaError(KafkaError._INVALID_ARG))

    consumer.store_offsets = refuse  # type: ignore[method-assign]
    source = _source(consumer)
    with pytest.raises(KafkaException):
        source.poll(timeout=0.01)
