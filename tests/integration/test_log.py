"""The log against the real broker: order per run, durability across a broker crash,
Java-compatible partitioning, and poison messages to the DLQ."""

from __future__ import annotations

import random
import threading
import uuid
from collections import defaultdict

import pytest
from confluent_kafka import Consumer, Message, Producer, TopicPartition

from es_agents.adapters.kafka import KafkaEventLog
from es_agents.adapters.kafka_source import KafkaSource
from es_agents.codec import AvroCodec
from es_agents.core import replay
from es_agents.core.commands import Approve, Command, StartRun
from es_agents.core.events import Event, StatePatched
from es_agents.dead_letters import DeadLetterQueue
from es_agents.dev import DevStack
from es_agents.lab.demo import script
from es_agents.partitioner import partition_for
from es_agents.settings import KafkaSettings
from tests.test_support import unsealed

pytestmark = pytest.mark.integration


def _patches(run_id: str, start: int, count: int) -> list[Event]:
    return [
        StatePatched(run_id=run_id, seq=seq, step=0, key="n", value_json=str(seq))
        for seq in range(start, start + count)
    ]


def test_interleaved_runs_come_back_in_order_per_run(
    kafka_settings: KafkaSettings,
) -> None:
    log = KafkaEventLog(kafka_settings)
    runs = {f"run-{uuid.uuid4().hex[:10]}": script_run for script_run in range(24)}
    logs = {run_id: script(run_id, steps=1 + n % 5) for run_id, n in runs.items()}
    cursors = dict.fromkeys(logs, 0)
    rng = random.Random(7)

    def writer(my_runs: list[str]) -> None:
        # Each thread appends its runs' events in random interleavings and batches.
        while True:
            live = [r for r in my_runs if cursors[r] < len(logs[r])]
            if not live:
                return
            run_id = rng.choice(live)
            n = rng.randint(1, 3)
            batch = logs[run_id][cursors[run_id] : cursors[run_id] + n]
            log.append(batch)
            cursors[run_id] += len(batch)

    run_ids = list(logs)
    threads = [threading.Thread(target=writer, args=(run_ids[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        for run_id, events in logs.items():
            back = log.read_run(run_id)
            assert unsealed(back) == events
            assert replay(back).status == "completed"
    finally:
        log.close()


def test_commands_and_events_of_a_run_share_a_partition_like_java_clients(
    kafka_settings: KafkaSettings,
) -> None:
    log = KafkaEventLog(kafka_settings)
    try:
        for i in range(30):
            run_id = f"run-{i}-{uuid.uuid4().hex[:6]}"
            (event_pos,) = log.append(_patches(run_id, 0, 1))
            command_pos = log.send(Approve(run_id=run_id, by="ann"))
            assert event_pos.partition == command_pos.partition
            assert event_pos.partition == partition_for(
                run_id, kafka_settings.partitions
            )
    finally:
        log.close()


@pytest.mark.serial  # kills the dev stack's broker under every other test
def test_every_acknowledged_append_survives_a_broker_sigkill(
    dev_stack: DevStack, kafka_settings: KafkaSettings
) -> None:
    settings = kafka_settings.model_copy(update={"delivery_timeout_ms": 120_000})
    log = KafkaEventLog(settings)
    run_ids = [f"run-{uuid.uuid4().hex[:10]}" for _ in range(4)]
    acked: dict[str, list[Event]] = defaultdict(list)
    kill_after = threading.Event()
    restarted = threading.Event()
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer() -> None:
        seqs = dict.fromkeys(run_ids, 0)
        try:
            while not stop.is_set():
                for run_id in run_ids:
                    batch = _patches(run_id, seqs[run_id], 2)
                    log.append(batch)  # returns only when the broker acknowledged
                    acked[run_id].extend(batch)
                    seqs[run_id] += 2
                total = sum(len(v) for v in acked.values())
                if total >= 200:
                    kill_after.set()
                if restarted.is_set() and total >= 600:
                    return
        except BaseException as e:
            errors.append(e)
            kill_after.set()

    thread = threading.Thread(target=writer)
    thread.start()
    assert kill_after.wait(60)
    dev_stack.kafka.kill()  # SIGKILL: no controlled shutdown, no flush
    acked_before_restart = sum(len(v) for v in acked.values())
    dev_stack.kafka.start()
    restarted.set()
    thread.join(180)
    stop.set()
    assert not thread.is_alive()
    assert not errors, errors
    assert sum(len(v) for v in acked.values()) > acked_before_restart
    try:
        for run_id in run_ids:
            back = log.read_run(run_id)
            ids = [e.event_id for e in back]
            assert len(ids) == len(set(ids)), "an event was duplicated"
            assert [e.seq for e in back] == list(range(len(back))), "order or gap"
            assert {e.event_id for e in acked[run_id]} <= set(ids), "acked event lost"
    finally:
        log.close()


def test_poison_messages_go_to_the_dlq_and_the_consumer_keeps_going(
    kafka_settings: KafkaSettings,
) -> None:
    codec = AvroCodec()
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    raw = Producer(
        {
            "bootstrap.servers": kafka_settings.bootstrap_servers,
            "partitioner": "murmur2_random",
        }
    )
    good_before = StartRun(run_id=run_id, agent="x:y")
    good_after = Approve(run_id=run_id, by="ann")
    bad_values = codec.encode_record(
        "approve", {**good_after.model_dump(), "command_id": "c", "run_id": run_id}
    )
    invalid = bytearray(bad_values)
    poison = [
        b"not avro at all",
        b"\xc3\x01" + b"\x07" * 8 + b"\x02",  # unknown schema fingerprint
        bytes(invalid[:-3]),  # truncated body
        codec.encode(Approve(run_id=run_id, by="ann")).replace(
            b"\xc3\x01", b"\xc3\x02", 1
        ),
    ]
    raw.produce(
        kafka_settings.commands_topic, key=run_id, value=codec.encode(good_before)
    )
    for value in poison:
        raw.produce(kafka_settings.commands_topic, key=run_id, value=value)
    raw.produce(
        kafka_settings.commands_topic, key=run_id, value=codec.encode(good_after)
    )
    assert raw.flush(30) == 0

    link = KafkaEventLog(kafka_settings)
    dlq = DeadLetterQueue(link, kafka_settings.dlq_topic)
    source: KafkaSource[Command] = KafkaSource(
        kafka_settings,
        kafka_settings.commands_topic,
        f"{kafka_settings.topic_prefix}.g",
        codec.decode_command,
        dlq,
    )
    received: list[Command] = []
    try:
        for _ in range(60):
            received += [r.message for r in source.poll(timeout=0.5)]
            if len(received) >= 2:
                break
        source.commit()
    finally:
        source.close()
        link.close()
    assert received == [good_before, good_after]
    assert source.dead_lettered == len(poison)

    partition = partition_for(run_id, kafka_settings.partitions)
    reader = Consumer(
        {
            "bootstrap.servers": kafka_settings.bootstrap_servers,
            "group.id": "dlq-check",
            "enable.auto.commit": False,
        }
    )
    reader.assign([TopicPartition(kafka_settings.dlq_topic, partition, 0)])
    dead = []
    for _ in range(40):
        dead += [m for m in reader.consume(10, timeout=0.5) if m.error() is None]
        if len(dead) >= len(poison):
            break
    reader.close()
    assert [m.value() for m in dead] == poison

    def headers(m: Message) -> dict[str, str]:
        raw = m.headers() or []
        pairs = raw.items() if isinstance(raw, dict) else raw
        return {k: v.decode() if isinstance(v, bytes) else str(v) for k, v in pairs}

    reasons = [headers(m)["es.dlq.reason"] for m in dead]
    assert "not an es-agents message" in reasons[0]
    assert "unknown schema fingerprint" in reasons[1]
    assert "does not decode" in reasons[2]
    assert "not an es-agents message" in reasons[3]
    for m in dead:
        assert headers(m)["es.dlq.topic"] == kafka_settings.commands_topic
        assert int(headers(m)["es.dlq.partition"]) == partition
    assert all(m.key() == run_id.encode() for m in dead)
