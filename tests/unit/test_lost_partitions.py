"""Partitions lost, not handed over (a Kafka member's session expired, as while the
group coordinator's broker is down): their runs go on, and when the group gives
them back unclaimed, nothing is claimed or loaded again. On the in-memory store,
whose source can lose its partitions on request; the same on Kafka is in
tests/integration/test_lost_partitions.py."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator

import pytest

from es_agents.app import build_ports, build_worker
from es_agents.core.commands import Approve, StartRun
from es_agents.core.fold import replay
from es_agents.lab.bench import GateLoop, ToolLoop
from es_agents.ports import Ports
from es_agents.runtime import worker as worker_module
from es_agents.runtime.worker import Worker
from es_agents.settings import KafkaSettings, Settings
from tests.unit.test_warm_runs import _paused, _resumed, _until


@pytest.fixture
def started() -> Iterator[Callable[[object], tuple[Worker, Ports]]]:
    workers: list[tuple[Worker, threading.Thread]] = []

    def start(agent: object) -> tuple[Worker, Ports]:
        kafka = KafkaSettings(topic_prefix=f"lost-{uuid.uuid4().hex[:8]}", partitions=1)
        settings = Settings(kafka=kafka, store="memory")
        ports = build_ports(settings)
        worker = build_worker(settings, agent)  # type: ignore[arg-type]
        thread = threading.Thread(target=worker.run)
        thread.start()
        workers.append((worker, thread))
        return worker, ports

    yield start
    for worker, thread in workers:
        worker.stop()
        thread.join(10)


def _lose(worker: Worker, seconds: float) -> None:
    """Lose the worker's partitions for ``seconds``; return once they are lost."""
    source = worker.source
    told = source._on_lost  # type: ignore[attr-defined]
    lost = threading.Event()

    def on_lost(partitions: list[int]) -> None:
        told(partitions)
        lost.set()

    source._on_lost = on_lost  # type: ignore[attr-defined]
    source.lose(seconds)  # type: ignore[attr-defined]
    _until(lost.is_set, "the partitions lost")
    source._on_lost = told  # type: ignore[attr-defined]


def _store_epoch(worker: Worker, ports: Ports) -> int | None:
    return ports.projections.current_epoch(worker.ownership.group, 0)


def test_a_run_steps_on_while_its_partition_is_lost_and_it_comes_back_unclaimed(
    started: Callable[[object], tuple[Worker, Ports]],
) -> None:
    worker, ports = started(ToolLoop(steps=400))
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    ports.log.send(StartRun(run_id=run_id, agent="bench"))
    _until(lambda: len(ports.log.read_run(run_id)) > 20, "the run stepping")
    epoch = worker.ownership.epoch(0)
    _lose(worker, 1.0)
    at_loss = len(ports.log.read_run(run_id))
    _until(
        lambda: len(ports.log.read_run(run_id)) > at_loss + 20,
        "steps appended while the partition is away",
        seconds=0.9,
    )
    _until(lambda: replay(ports.log.read_run(run_id)).status == "completed", "done")
    assert worker.ownership.epoch(0) == epoch  # kept: no new claim
    assert _store_epoch(worker, ports) == epoch
    events = ports.log.read_run(run_id)
    assert [e.seq for e in events] == list(range(len(events)))


def test_a_paused_run_stays_warm_when_its_partition_comes_back_unclaimed(
    started: Callable[[object], tuple[Worker, Ports]],
) -> None:
    worker, ports = started(GateLoop())
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    ports.log.send(StartRun(run_id=run_id, agent=GateLoop.name))
    _until(lambda: len(worker.warm) == 1, "the paused run kept warm")
    epoch = worker.ownership.epoch(0)
    _lose(worker, 0.3)
    ports.log.send(Approve(run_id=run_id, by="alice"))  # read once it is back
    _until(lambda: _resumed(ports, run_id) == 1, "the approval applied")
    _until(lambda: _paused(ports, run_id), "paused again")
    assert worker.ownership.epoch(0) == epoch
    assert worker.warm.hits == 1  # not loaded again


def test_a_partition_claimed_by_another_meanwhile_is_claimed_again(
    started: Callable[[object], tuple[Worker, Ports]],
) -> None:
    worker, ports = started(GateLoop())
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    ports.log.send(StartRun(run_id=run_id, agent=GateLoop.name))
    _until(lambda: len(worker.warm) == 1, "the paused run kept warm")
    epoch = worker.ownership.epoch(0)
    _lose(worker, 0.5)
    # Another worker took the partition meanwhile (its claim takes the next epoch).
    other = ports.projections.next_epoch(worker.ownership.group, 0)
    ports.log.send(Approve(run_id=run_id, by="alice"))
    _until(lambda: _resumed(ports, run_id) == 1, "the approval applied")
    mine = worker.ownership.epoch(0)
    assert mine > other > epoch  # claimed again, above the other's
    assert worker.warm.hits == 0  # its state loaded again, not trusted


def test_a_partition_not_given_back_within_the_hold_is_let_go(
    started: Callable[[object], tuple[Worker, Ports]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(worker_module, "HOLD_SECONDS", 0.2)
    worker, ports = started(GateLoop())
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    ports.log.send(StartRun(run_id=run_id, agent=GateLoop.name))
    _until(lambda: len(worker.warm) == 1, "the paused run kept warm")
    epoch = worker.ownership.epoch(0)
    _lose(worker, 3.0)
    _until(
        lambda: worker.ownership.current_epoch(0) is None, "let go at the hold's end"
    )
    assert len(worker.warm) == 0
    _until(lambda: worker.ownership.current_epoch(0) is not None, "assigned again")
    assert worker.ownership.epoch(0) > epoch  # a new claim
    ports.log.send(Approve(run_id=run_id, by="alice"))
    _until(lambda: _resumed(ports, run_id) == 1, "the approval applied")
