"""Flow control on the real broker and database: starts against a limit of active
runs on two worker processes, one SIGKILLed mid-way (``bench flow``, small) --
never more active than the limit, by the log's own spans and by sampled places;
every run completed with exactly one start; priority 1 waited less than 0."""

from __future__ import annotations

import pytest

from es_agents.lab.bench_flow import bench_flow

pytestmark = pytest.mark.integration


def test_a_limit_of_active_runs_holds_across_a_worker_kill(dev_stack: object) -> None:
    lines: list[str] = []
    summary = bench_flow(
        runs=90, limit=3, high_every=5, partitions=3, kill=True, echo=lines.append
    )
    assert summary["worker_killed"]
    assert summary["completed"] == 90, lines
    assert summary["started_twice"] == 0, lines
    assert int(str(summary["queued"])) >= 45  # most runs waited for a place
    assert summary["most_active_from_log"] == 3, lines  # held, and used
    assert 0 < int(str(summary["most_places_sampled"])) <= 3, lines
    # The queue's order is held to exactly by the contract and harness tests; here,
    # across a worker kill, the bench's sampled measure of it is reported only.
    high, low = summary["wait_ms_mean_priority_1"], summary["wait_ms_mean_priority_0"]
    assert isinstance(high, float)
    assert isinstance(low, float)
    assert high < low, lines  # priority 1 waited less
