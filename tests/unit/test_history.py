"""A run's history read back from the log at the offsets the projection lists."""

from __future__ import annotations

import random

from es_agents.adapters.memory_log import MemoryBroker, MemoryEventLog
from es_agents.history import read_projected, read_runs
from es_agents.ports import Positions
from tests.test_support import script_of

TOPIC = "t.events"


def _log() -> MemoryEventLog:
    broker = MemoryBroker(partitions=1)
    for topic in (TOPIC, "t.commands"):
        broker.create(topic)
    return MemoryEventLog(broker, TOPIC, "t.commands")


def _offsets(log: MemoryEventLog, run_id: str, upto: int) -> dict[int, int]:
    """Offset -> seq of the run's events below seq ``upto``, as a projector has
    them in ``run_events``."""
    found: dict[int, int] = {}
    for record in log.read_partition(TOPIC, 0):
        if record.key == run_id:
            event = log.decode_event(record.value)
            if event.seq < upto:
                found[record.offset] = event.seq
    return found


def test_runs_are_read_from_the_projected_offsets_and_the_tail_beyond() -> None:
    log = _log()
    a = script_of("run-a", random.Random(1), patches=12)
    b = script_of("run-b", random.Random(2), patches=7)
    for n in range(max(len(a), len(b))):  # interleaved, as runs write
        log.append(a[n : n + 1] + b[n : n + 1])
    projected_b = _offsets(log, "run-b", 3)
    until = max(projected_b) + 1  # the projector got this far
    got = read_runs(
        log,
        TOPIC,
        {
            "run-a": Positions(_offsets(log, "run-a", 3), until),
            "run-b": Positions(projected_b, until),
        },
    )
    assert got["run-a"] == log.read_run("run-a")
    assert got["run-b"] == log.read_run("run-b")
    assert [e.seq for e in got["run-b"]] == list(range(len(b)))
    whole = read_projected(log, TOPIC, "run-a", _offsets(log, "run-a", len(a)))
    assert [log.decode_event(w.value) for w in whole] == log.read_run("run-a")


def test_a_run_whose_offsets_hold_other_records_is_left_out() -> None:
    """A run of another prefix sharing the database: its rows name offsets of
    another topic, which here hold another run's records."""
    log = _log()
    a = script_of("run-a", random.Random(1), patches=4)
    log.append(a)
    where = _offsets(log, "run-a", len(a))
    got = read_runs(
        log,
        TOPIC,
        {
            "run-a": Positions(where, max(where) + 1),
            "other": Positions(dict.fromkeys(where, 0), max(where) + 1),
        },
    )
    assert got == {"run-a": log.read_run("run-a")}
    assert len(got["run-a"]) == len(a)
