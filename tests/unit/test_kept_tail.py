"""What a worker keeps of a partition's stretch past the projector: a run's records
and the keyless claims from any offset it covers, in order, the same as reading the
log; what is below the loads' start forgotten in bulk; too long a stretch given up."""

from __future__ import annotations

import random

from es_agents.adapters.kept_tail import KeptTail
from es_agents.ports import Record


def _log(n: int, seed: int = 7) -> list[Record]:
    rng = random.Random(seed)
    keys = [None, "run-a", "run-b", "run-c"]
    return [
        Record("t", 0, offset, rng.choice(keys), f"v{offset}".encode())
        for offset in range(100, 100 + n)
    ]


def _wanted(log: list[Record], key: str, start: int) -> list[Record]:
    return [r for r in log if r.offset >= start and r.key in (None, key)]


def test_a_runs_records_and_the_claims_as_the_log_has_them() -> None:
    log = _log(400)
    tail = KeptTail(100)
    for record in log[:250]:
        tail.add(record)
    tail.read_to(350, 1.0)
    for record in log[250:]:
        tail.add(record)
    tail.read_to(500, 2.0)
    assert tail.end == 500
    for key in ("run-a", "run-b", "run-z"):
        for start in (100, 101, 333, 499, 500):
            assert list(tail.of(key, start)) == _wanted(log, key, start)


def test_what_is_below_the_loads_start_goes_once_it_is_half() -> None:
    log = _log(400)
    tail = KeptTail(100)
    for record in log:
        tail.add(record)
    tail.read_to(500, 2.0)
    tail.drop_below(200)  # a quarter below: kept, lists untouched
    assert tail.count == 400
    assert tail.covers(150)
    tail.drop_below(350)  # more than half below: forgotten
    assert tail.count == 150
    assert not tail.covers(349)
    assert tail.covers(350)
    assert list(tail.of("run-c", 350)) == _wanted(log, "run-c", 350)
    tail.drop_below(10_000)  # everything read is below
    assert tail.count == 0
    assert list(tail.of("run-c", 10_000)) == []


def test_too_long_a_stretch_says_so() -> None:
    tail = KeptTail(100, limit=10)
    for record in _log(10):
        tail.add(record)
    assert not tail.full
    tail.add(Record("t", 0, 110, "run-a", b""))
    assert tail.full


def test_loads_that_waited_share_a_read_that_began_after_they_asked() -> None:
    tail = KeptTail(100)
    tail.read_to(120, began=10.0)
    assert tail.current_for(asked=9.5, at_least=120)  # asked before that read began
    assert not tail.current_for(asked=10.5, at_least=0)  # asked after: read again
    assert not tail.current_for(asked=9.5, at_least=121)  # its own write not in it
