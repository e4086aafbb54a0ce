"""Where ``bench growth`` stops its runs: any size it accepts has an early stop and
at least one resume after it, inside the run."""

from __future__ import annotations

import itertools

import pytest

from es_agents.lab.bench_growth import stops_for


@pytest.mark.parametrize("steps", [8, 9, 10, 12, 20, 200, 20_000])
@pytest.mark.parametrize("resumes", [1, 2, 5, 50])
def test_the_stops_fit_in_the_run(steps: int, resumes: int) -> None:
    early, late = stops_for(steps, resumes)
    assert 2 <= early < late[0]
    assert late == sorted(late)
    assert all(b - a == 2 for a, b in itertools.pairwise(late))
    assert late[-1] == steps - 2
    assert 1 <= len(late) - 1 <= resumes


def test_a_run_too_short_is_refused_with_why() -> None:
    with pytest.raises(ValueError, match="8 at least"):
        stops_for(7, 5)
