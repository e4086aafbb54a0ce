"""Runs kept warm in the worker that paused them, on the memory store: the next
command skips the load while the partition's epoch is the one they were loaded
under, and the run's log is the same as when every activation loads."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from es_agents.app import build_ports, build_worker
from es_agents.core.commands import Approve, StartRun
from es_agents.core.events import Event
from es_agents.core.fold import replay
from es_agents.lab.bench import GateLoop
from es_agents.ports import Ports
from es_agents.runtime.worker import Worker
from es_agents.settings import KafkaSettings, Settings


def _until(check: Callable[[], bool], what: str, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds} s: {what}")
        time.sleep(0.005)


def _paused(ports: Ports, run_id: str) -> bool:
    events = ports.log.read_run(run_id)
    return bool(events) and replay(events).status == "paused"


def _resumed(ports: Ports, run_id: str) -> int:
    return sum(e.wire_name == "resumed" for e in ports.log.read_run(run_id))


def _approve_thrice(warm_runs: int) -> tuple[Worker, list[Event], int]:
    """A run started and approved three times in one worker; the worker, the run's
    events, and how many times the run was loaded."""
    kafka = KafkaSettings(topic_prefix=f"warm-{uuid.uuid4().hex[:8]}", partitions=2)
    settings = Settings(kafka=kafka, store="memory", warm_runs=warm_runs)
    ports = build_ports(settings)
    worker = build_worker(settings, GateLoop())
    loads = 0
    load = worker.ctx.loader.load

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal loads
        loads += 1
        return load(*args, **kwargs)

    worker.ctx.loader.load = counted  # type: ignore[method-assign]
    thread = threading.Thread(target=worker.run)
    thread.start()
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    try:
        ports.log.send(StartRun(run_id=run_id, agent=GateLoop.name))
        _until(lambda: _paused(ports, run_id), "paused")
        for n in range(1, 4):
            ports.log.send(Approve(run_id=run_id, by="alice"))
            _until(lambda: _resumed(ports, run_id) >= n, f"approval {n}")  # noqa: B023
            _until(
                lambda: _paused(ports, run_id),
                "paused again",
            )
    finally:
        worker.stop()
        thread.join(10)
    return worker, ports.log.read_run(run_id), loads


def _shape(events: list[Event]) -> list[tuple[str, int, int]]:
    return [(e.wire_name, e.seq, e.step) for e in events]


def test_a_paused_run_resumes_from_the_worker_that_paused_it_without_a_load() -> None:
    warm, warm_events, warm_loads = _approve_thrice(warm_runs=128)
    cold, cold_events, cold_loads = _approve_thrice(warm_runs=0)
    # An approval that comes while the run's activation is still ending is applied
    # by that activation (no second one), so count activations, not approvals:
    # warm, only the start loads and every later activation is a hit; cold, every
    # activation loads.
    assert warm_loads == 1  # the start only
    assert 1 <= warm.warm.hits <= 3
    assert cold.warm.hits == 0
    assert 2 <= cold_loads <= 4
    assert _shape(warm_events) == _shape(cold_events)
    assert replay(warm_events).status == replay(cold_events).status == "paused"


def test_a_run_kept_under_an_older_epoch_is_loaded_again() -> None:
    """The partition was revoked and assigned again (another worker may have written
    the run meanwhile): the kept state is not trusted."""
    kafka = KafkaSettings(topic_prefix=f"warm-{uuid.uuid4().hex[:8]}", partitions=1)
    settings = Settings(kafka=kafka, store="memory")
    ports = build_ports(settings)
    worker = build_worker(settings, GateLoop())
    thread = threading.Thread(target=worker.run)
    thread.start()
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    try:
        ports.log.send(StartRun(run_id=run_id, agent=GateLoop.name))
        _until(lambda: len(worker.warm) == 1, "the paused run kept")
        worker.ownership.assign([0])  # a new epoch for the partition
        ports.log.send(Approve(run_id=run_id, by="alice"))
        _until(lambda: _resumed(ports, run_id) == 1, "the approval applied")
        _until(lambda: len(worker.warm) == 1, "kept again, under the new epoch")
        assert worker.warm.hits == 0
        worker.warm.drop([0])
        assert len(worker.warm) == 0
    finally:
        worker.stop()
        thread.join(10)


@pytest.mark.parametrize("size", [0, 2])
def test_the_kept_runs_are_bounded(size: int) -> None:
    kafka = KafkaSettings(topic_prefix=f"warm-{uuid.uuid4().hex[:8]}", partitions=2)
    settings = Settings(kafka=kafka, store="memory", warm_runs=size)
    ports = build_ports(settings)
    worker = build_worker(settings, GateLoop())
    thread = threading.Thread(target=worker.run)
    thread.start()
    runs = [f"run-{uuid.uuid4().hex[:8]}" for _ in range(4)]
    try:
        for run_id in runs:
            ports.log.send(StartRun(run_id=run_id, agent=GateLoop.name))
        _until(
            lambda: all(_paused(ports, r) for r in runs),
            "all paused",
        )
        _until(lambda: len(worker.warm) == size, f"{size} kept")
    finally:
        worker.stop()
        thread.join(10)
