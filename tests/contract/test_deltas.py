"""The ``Deltas`` port (model answers while they stream), on every store: a
follower gets one run's deltas in the order they were published, none of another
run's, from a point in time on; it stops when told to, once nothing comes."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from es_agents.ports import Delta, Ports


def _follow(ports: Ports, run_id: str, since: datetime, want: int) -> list[Delta]:
    assert ports.deltas is not None
    got: list[Delta] = []
    deadline = time.monotonic() + 30

    def stop() -> bool:  # once the ones we wait for came (or the deadline passed)
        return len(got) >= want or time.monotonic() > deadline

    for delta in ports.deltas.follow(run_id, since, stop):
        got.append(delta)
    return got


def test_a_follower_gets_its_runs_deltas_in_order(ports: Ports) -> None:
    assert ports.deltas is not None
    before = datetime.now(UTC) - timedelta(seconds=1)
    now = time.time()
    ours = [
        Delta("run-a", 3, 1, "start", "", now),
        Delta("run-a", 3, 1, "text", "Hello, ", now),
        Delta("run-b", 1, 1, "text", "not ours", now),
        Delta("run-a", 3, 1, "text", "world.", now),
        Delta("run-a", 3, 1, "end", "", now),
    ]
    for delta in ours:
        ports.deltas.publish(delta)
    got = _follow(ports, "run-a", before, 4)
    assert [(d.kind, d.text) for d in got] == [
        ("start", ""),
        ("text", "Hello, "),
        ("text", "world."),
        ("end", ""),
    ]
    assert {(d.run_id, d.step, d.attempt) for d in got} == {("run-a", 3, 1)}
    # From a later point in time: nothing of what came before.
    later = datetime.now(UTC) + timedelta(seconds=2)
    assert _follow(ports, "run-a", later, 0) == []
