"""A worker whose group membership is lost, not handed over -- here, as after a
group coordinator moved, fenced out by a member with its instance id -- keeps its
runs going: it joins again, gets its partitions back unclaimed, and goes on under
the same epoch, without a claim or a reload (on a real broker)."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from confluent_kafka import Consumer

from es_agents.adapters.kafka import KafkaEventLog
from es_agents.app import build_ports, build_worker
from es_agents.core.commands import StartRun
from es_agents.core.fold import replay
from es_agents.lab.bench import ToolLoop
from es_agents.settings import KafkaSettings, Settings
from tests.integration.test_commands import until

pytestmark = pytest.mark.integration


def test_a_worker_fenced_out_of_its_group_keeps_its_runs_and_its_epoch(
    kafka_settings: KafkaSettings, database_url: str
) -> None:
    kafka = kafka_settings.model_copy(update={"session_timeout_ms": 6000})
    settings = Settings(kafka=kafka, database_url=database_url, payloads="off")
    instance = f"w-{uuid.uuid4().hex[:8]}"
    worker = build_worker(settings, ToolLoop(steps=1500), instance_id=instance)
    lost: list[float] = []
    told = worker.source._on_lost  # type: ignore[attr-defined]

    def on_lost(partitions: list[int]) -> None:
        lost.append(time.monotonic())
        told(partitions)

    worker.source._on_lost = on_lost  # type: ignore[attr-defined]
    thread = threading.Thread(target=worker.run)
    thread.start()
    log = KafkaEventLog(kafka)
    ports = build_ports(settings)
    run_id = f"kept-{uuid.uuid4().hex[:8]}"
    partition = log.partition_for(run_id)
    intruder: Consumer | None = None
    try:
        log.send(StartRun(run_id=run_id, agent="bench"))
        until(lambda: len(log.read_run(run_id)) > 30, 60, "the run never stepped")
        epoch = worker.ownership.epoch(partition)
        # A member with the same instance id takes its place in the group; the
        # worker's next heartbeat is refused (fenced), and it joins again.
        intruder = Consumer(
            {
                "bootstrap.servers": kafka.bootstrap_servers,
                "group.id": worker.ownership.group,
                "group.instance.id": instance,
                "session.timeout.ms": 6000,
                "partition.assignment.strategy": "cooperative-sticky",
            }
        )
        intruder.subscribe([kafka.commands_topic])
        deadline = time.monotonic() + 30
        while not intruder.assignment() and time.monotonic() < deadline:
            intruder.poll(0.1)
        assert intruder.assignment(), "the intruder never took the worker's place"
        intruder.close()
        intruder = None
        until(lambda: bool(lost), 30, "the worker never lost its partitions")
        until(
            lambda: replay(log.read_run(run_id)).status == "completed",
            120,
            "the run never completed",
        )
        assert thread.is_alive()  # no exit over it
        assert worker.ownership.epoch(partition) == epoch  # kept: no new claim
        group = worker.ownership.group
        assert ports.projections.current_epoch(group, partition) == epoch
        events = log.read_run(run_id)
        assert [e.seq for e in events] == list(range(len(events)))
        assert replay(events).tool_calls == 1500
    finally:
        if intruder is not None:
            intruder.close()
        worker.stop()
        thread.join(30)
        log.close()
        ports.close()
