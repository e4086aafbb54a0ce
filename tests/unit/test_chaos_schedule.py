"""The chaos fault schedule is a pure function of the seed (bench chaos)."""

from __future__ import annotations

from es_agents.lab.chaos.schedule import (
    CRASH_POINTS,
    KINDS,
    fault_schedule,
    fingerprint,
)


def test_the_same_seed_gives_the_same_schedule() -> None:
    first = fault_schedule(seed=7, seconds=900, workers=2)
    again = fault_schedule(seed=7, seconds=900, workers=2)
    other = fault_schedule(seed=8, seconds=900, workers=2)
    assert first == again
    assert fingerprint(first) == fingerprint(again)
    assert fingerprint(first) != fingerprint(other)


def test_a_schedule_has_every_kind_in_each_round_within_the_window() -> None:
    faults = fault_schedule(seed=1, seconds=600, workers=3, mean_gap=5)
    gaps = [f.gap for f in faults]
    assert all(gap > 0 for gap in gaps)
    assert sum(gaps) < 600
    for start in range(0, len(faults) - len(KINDS) + 1, len(KINDS)):
        assert {f.kind for f in faults[start : start + len(KINDS)]} == set(KINDS)
    for fault in faults:
        assert (0 <= fault.worker < 3) == fault.kind.endswith("_worker")
        if fault.kind == "kill_worker":
            point, _, nth = fault.crash_at.partition("@")
            assert point in CRASH_POINTS
            assert 1 <= int(nth) <= 3
        else:
            assert fault.crash_at == ""
