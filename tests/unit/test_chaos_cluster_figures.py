"""The cluster chaos run's figures of a broker fault: the seconds from the kill to
the first acknowledgement after the stall it caused, and rates between moments."""

from __future__ import annotations

from pathlib import Path

from es_agents.lab.chaos import cluster_faults
from es_agents.lab.chaos.cluster_faults import AckClock


def _clock(tmp_path: Path, samples: list[tuple[float, int]]) -> AckClock:
    clock = AckClock(tmp_path)
    clock.close()  # fed by hand below, not by its thread
    clock._times = [t for t, _ in samples]
    clock._counts = [n for _, n in samples]
    return clock


def test_resumed_is_the_first_acknowledgement_after_the_stall(tmp_path: Path) -> None:
    # 10/s until the kill at t=100, a couple in flight, nothing for 4.5 s, then on.
    samples = [(t / 10, t) for t in range(1001)]
    samples += [(100.1, 1001), (100.2, 1002)]
    samples += [(100.2 + k * 0.5, 1002) for k in range(1, 10)]  # to 104.7
    samples += [(104.7 + k * 0.1, 1002 + k) for k in range(1, 100)]
    clock = _clock(tmp_path, samples)
    assert round(clock.resumed(100.0, 114.0), 1) == 4.8
    assert clock.rate(40.0, 100.0) == 10.0
    assert clock.count_at(102.0) == 1002


def test_no_stall_is_zero_and_a_stall_to_the_end_is_the_whole_window(
    tmp_path: Path,
) -> None:
    steady = _clock(tmp_path, [(t / 10, t) for t in range(300)])
    assert steady.resumed(10.0, 20.0) == 0.0
    stuck = _clock(tmp_path, [(t / 10, min(t, 100)) for t in range(300)])
    assert stuck.resumed(10.0, 20.0) == 10.0
    assert cluster_faults.RESUMED_AFTER_GAP == 1.0
