"""The bad-input catalogue: each case ends with a clear error or an es.dlq entry with
the reason, the worker still serving other runs, and nothing lost."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from es_agents.codec import AvroCodec
from es_agents.core import replay
from es_agents.core.commands import Approve, StartRun
from es_agents.core.events import ToolReturned
from es_agents.lab.demo import run_worker, ticket_stats
from es_agents.partitioner import partition_for
from es_agents.settings import KafkaSettings
from tests.integration.test_runtime import _events, _start

pytestmark = pytest.mark.integration


def _dlq_reasons(kafka: KafkaSettings, run_id: str) -> list[str]:
    consumer = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap_servers,
            "group.id": "dlq-read",
            "enable.auto.commit": False,
        }
    )
    partition = partition_for(run_id, kafka.partitions)
    consumer.assign([TopicPartition(kafka.dlq_topic, partition, 0)])
    reasons = []
    for _ in range(6):
        for msg in consumer.consume(50, timeout=0.5):
            if msg.error() is None and msg.key() == run_id.encode():
                headers = dict(msg.headers() or [])
                reason = headers.get("es.dlq.reason")
                reasons.append(reason.decode() if isinstance(reason, bytes) else "")
    consumer.close()
    return reasons


def test_model_and_tool_mistakes_become_recorded_errors_and_the_run_goes_on(
    env: dict[str, str], kafka_settings: KafkaSettings, tickets_url: str
) -> None:
    run_id = _start(kafka_settings, "picky")
    # Without an object store, a result larger than an event is the call's error.
    env = {**env, "ES_AGENTS_PAYLOADS": "off"}
    done = run_worker(env, agent="tests.agents:picky", instance_id="w1")
    assert done.returncode == 0, done.stderr[-2000:]
    events = _events(kafka_settings, run_id)
    state = replay(events)
    assert state.status == "completed"
    errors = [e.error for e in events if isinstance(e, ToolReturned)]
    assert errors[0] == "unknown tool 'no_such_tool'"
    assert errors[1] is not None
    assert "invalid arguments" in errors[1]
    assert errors[2] == "ValueError: the tool broke"
    assert errors[3] is not None
    assert "exceeds the 900000-byte event limit" in errors[3]
    assert ticket_stats(tickets_url, run_id)["tickets"] == 0


def test_an_unparsable_model_response_fails_the_run_not_the_worker(
    env: dict[str, str], kafka_settings: KafkaSettings
) -> None:
    bad = _start(kafka_settings, "garbled")
    done = run_worker(env, agent="tests.agents:garbled", instance_id="w1")
    assert done.returncode == 0, done.stderr[-2000:]
    state = replay(_events(kafka_settings, bad))
    assert state.status == "failed"
    assert state.error is not None
    assert state.error.startswith("model_error: unparsable model response")
    assert "gave up after 5 tries" in state.error
    assert state.model_calls == 0  # nothing was recorded as a completion


def test_bad_commands_go_to_the_dlq_and_the_worker_keeps_serving(
    env: dict[str, str], kafka_settings: KafkaSettings
) -> None:
    codec = AvroCodec()
    victim = "run-victim-" + kafka_settings.topic_prefix[-6:]
    valid_avro_invalid_values = codec.encode_record(
        "approve", {**Approve(run_id="x", by="ann").model_dump(), "run_id": ""}
    )
    raw = Producer(
        {
            "bootstrap.servers": kafka_settings.bootstrap_servers,
            "partitioner": "murmur2_random",
        }
    )
    for value in (
        b"garbage\x00\x01",
        b"\x00\x01garbage",
        b"\xc3\x01" + b"\x09" * 8 + b"\x00",
        valid_avro_invalid_values,
    ):
        raw.produce(kafka_settings.commands_topic, key=victim, value=value)
    # Out of order: an approval for a run whose start comes after it.
    raw.produce(
        kafka_settings.commands_topic,
        key=victim,
        value=codec.encode(Approve(run_id=victim, by="early")),
    )
    start = StartRun(run_id=victim, agent="picky", command_id="same-id")
    raw.produce(kafka_settings.commands_topic, key=victim, value=codec.encode(start))
    # The same command id again, with another body: refused with the reason.
    twin = StartRun(
        run_id=victim,
        agent="picky",
        command_id="same-id",
        input_json=json.dumps({"other": True}),
    )
    raw.produce(kafka_settings.commands_topic, key=victim, value=codec.encode(twin))
    # A run of an agent this worker does not serve: not refused, it waits for one.
    raw.produce(
        kafka_settings.commands_topic,
        key=victim + "-x",
        value=codec.encode(StartRun(run_id=victim + "-x", agent="nobody")),
    )
    assert raw.flush(30) == 0
    healthy = _start(kafka_settings, "picky")

    done = run_worker(env, agent="tests.agents:picky", instance_id="w1")
    assert done.returncode == 0, done.stderr[-2000:]
    assert replay(_events(kafka_settings, healthy)).status == "completed"
    victim_state = replay(_events(kafka_settings, victim))
    assert victim_state.status == "completed"
    assert victim_state.input_json == "{}"  # the first body, not the twin's
    reasons = _dlq_reasons(kafka_settings, victim)
    assert any("not an es-agents message" in r for r in reasons), reasons
    assert any("but no registry" in r for r in reasons), reasons
    assert any("unknown schema fingerprint" in r for r in reasons), reasons
    assert any("invalid values" in r for r in reasons)
    assert any(r.startswith(f"refused: unknown run {victim}") for r in reasons), reasons
    assert any("already applied" in r and "another input" in r for r in reasons), (
        reasons
    )
    assert _dlq_reasons(kafka_settings, victim + "-x") == []
    assert _events(kafka_settings, victim + "-x") == []
