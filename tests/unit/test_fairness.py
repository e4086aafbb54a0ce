"""More active runs than a worker makes calls at once (``threads``: its call pool's
bound): every run progresses -- runs are tasks on one event loop, each awaiting at
its appends and calls -- and nothing is repeated."""

from __future__ import annotations

import threading
import time
import uuid

from es_agents.app import build_ports, build_worker
from es_agents.core import replay
from es_agents.core.commands import StartRun
from es_agents.core.events import ToolCallRequested, ToolReturned
from es_agents.lab.bench import ToolLoop
from es_agents.settings import KafkaSettings, Settings


def test_runs_beyond_the_call_bound_take_turns() -> None:
    kafka = KafkaSettings(topic_prefix=f"slices-{uuid.uuid4().hex[:8]}", partitions=2)
    settings = Settings(kafka=kafka, store="memory", payloads="off")
    ports = build_ports(settings)
    endless = ToolLoop(10**9)  # no run of it ends by itself
    runs = [f"run-{n}-{uuid.uuid4().hex[:4]}" for n in range(6)]
    worker = build_worker(settings, endless, threads=2)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        for run_id in runs:
            ports.log.send(StartRun(run_id=run_id, agent="bench"))

        def progress() -> dict[str, int]:
            return {
                r: sum(isinstance(e, ToolReturned) for e in ports.log.read_run(r))
                for r in runs
            }

        deadline = time.monotonic() + 60
        while min(progress().values()) < 20:  # each run, well on its way
            assert time.monotonic() < deadline, f"runs starved: {progress()}"
            time.sleep(0.05)
    finally:
        worker.stop()
        thread.join(30)
    assert not thread.is_alive()
    for run_id in runs:
        events = ports.log.read_run(run_id)
        assert [e.seq for e in events] == list(range(len(events)))  # no gap, no twin
        calls = [e.call_id for e in events if isinstance(e, ToolCallRequested)]
        assert len(calls) == len(set(calls))  # no step taken twice across slices
        state = replay(events)
        assert state.status == "running"
        assert state.tool_calls == sum(isinstance(e, ToolReturned) for e in events)
