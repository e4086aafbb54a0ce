"""Payloads of any size on the real stack: a 5 MB and a 50 MB tool result and a 2 MB
completion go to the S3 server by their SHA-256 while the log keeps references; fold,
projection and replay read them back whole. A missing object pauses its run with
``payload_unavailable``, and the run goes on once the object is back."""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka import Consumer, TopicPartition

from es_agents.adapters.kafka import KafkaEventLog
from es_agents.adapters.s3 import S3BlobStore
from es_agents.app import build_projector
from es_agents.client import Client
from es_agents.core import replay
from es_agents.core.events import ToolReturned
from es_agents.dev import DevStack
from es_agents.lab.demo import cli, run_worker
from es_agents.payloads import ClaimCheck
from es_agents.settings import KafkaSettings, Settings

pytestmark = pytest.mark.integration


def _store(stack: DevStack) -> S3BlobStore:
    d = stack.dev
    return S3BlobStore(d.s3_endpoint, d.s3_bucket, d.s3_access_key, d.s3_secret_key)


def _raw_sizes(kafka: KafkaSettings, run_id: str) -> list[int]:
    """Bytes of each of the run's records as the log holds them."""
    consumer = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap_servers,
            "group.id": "sizes",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
        }
    )
    log = KafkaEventLog(kafka)
    partition = log.partition_for(run_id)
    log.close()
    consumer.assign([TopicPartition(kafka.events_topic, partition, 0)])
    sizes: list[int] = []
    while True:
        got = consumer.consume(1, timeout=10)
        assert got, "no end of partition"
        msg = got[0]
        if msg.error() is not None:
            break  # partition EOF
        if msg.key() == run_id.encode():
            sizes.append(len(msg.value() or b""))
    consumer.close()
    return sizes


def _events(settings: Settings, run_id: str) -> list[object]:
    from es_agents.app import build_claim_check  # noqa: PLC0415

    claims = build_claim_check(settings)
    assert claims is not None
    log = KafkaEventLog(settings.kafka, restore=claims.restore)
    try:
        return list(log.read_run(run_id))
    finally:
        log.close()


def test_large_payloads_travel_by_reference(
    env: dict[str, str],
    kafka_settings: KafkaSettings,
    database_url: str,
    dev_stack: DevStack,
) -> None:
    settings = Settings(kafka=kafka_settings, database_url=database_url)
    with Client(settings) as client:
        run = client.start("bulky", wait=0).run_id
    done = run_worker(env, agent="tests.agents:bulky", instance_id="", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    events = _events(settings, run)
    state = replay(events)  # type: ignore[arg-type]
    assert state.status == "completed", state.error
    results = [e for e in events if isinstance(e, ToolReturned)]
    assert [len(e.result_json or "") for e in results] == [5_000_002, 50_000_002]
    assert len(json.loads(state.output_json or "{}")["answer"]) == 2_000_000
    sizes = _raw_sizes(kafka_settings, run)
    assert max(sizes) < 2_000, sizes  # the log holds references only
    # The projection folds the payloads back; its snapshot resumes the whole state.
    projector = build_projector(settings, batch_size=100)
    projector.run(until_caught_up=True, idle_seconds=0.3)
    with Client(settings) as client:
        view = client.status(run)
    assert view.status == "completed"
    assert view.state is not None
    assert view.state.transcript == state.transcript
    # replay reads every payload back and checks its hash.
    shown = cli(env, "replay", run)
    assert shown.returncode == 0, shown.stderr
    assert "status=completed" in shown.stdout
    # What a 5 MB claim costs on this S3 server: store, then read back and check.
    check = ClaimCheck(_store(dev_stack))
    big = results[0]
    started = time.perf_counter()
    claimed = check.claim(big)
    stored = time.perf_counter()
    assert check.restore(claimed) == big
    print(
        f"claim check of 5 MB: store {1000 * (stored - started):.0f} ms, "
        f"read back {1000 * (time.perf_counter() - stored):.0f} ms"
    )


def test_a_missing_payload_pauses_the_run_until_it_is_back(
    env: dict[str, str],
    kafka_settings: KafkaSettings,
    database_url: str,
    dev_stack: DevStack,
) -> None:
    settings = Settings(kafka=kafka_settings, database_url=database_url)
    with Client(settings) as client:
        run = client.start("fragile", wait=0).run_id
        first = run_worker(env, agent="tests.agents:fragile", instance_id="w1")
        assert first.returncode == 0, first.stderr[-3000:]
        assert client.status(run).status == "paused"  # at the gate
        log = KafkaEventLog(kafka_settings)
        [claimed] = [
            e for e in log.read_run(run, restore=False) if isinstance(e, ToolReturned)
        ]
        log.close()
        [claim] = claimed.claims
        store = _store(dev_stack)
        kept = store.get(claim.key)
        store._client.delete_object(Bucket=store.bucket, Key=claim.key)
        assert client.approve(run, by="ann", wait=0).status == "queued"
        second = run_worker(env, agent="tests.agents:fragile", instance_id="w1")
        assert second.returncode == 0, second.stderr[-3000:]
        view = client.status(run)
        assert view.state is not None
        assert view.state.waiting is not None
        assert view.state.waiting.reason == "payload_unavailable"
        detail = json.loads(view.state.waiting.detail_json)
        assert (detail["run_id"], detail["key"]) == (run, claim.key)
        assert view.payload_problem is not None
        assert claim.key in view.payload_problem
        store.put(claim.key, kept)  # the object is back
        assert client.provide_input(run, "ops", "{}", wait=0).status == "queued"
        last = run_worker(env, agent="tests.agents:fragile", instance_id="w1")
        assert last.returncode == 0, last.stderr[-3000:]
        assert client.status(run).status == "completed"
