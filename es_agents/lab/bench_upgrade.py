"""``es-agents bench upgrade``: ``upgrade check`` over many waiting runs.

``--runs`` runs of ``--length`` events, each paused at a gate, are appended straight
to a scratch topic and projected into a scratch database. Then the check runs as
``es-agents upgrade check`` would, twice: with the code that started them (every
run goes on: ``verbatim``, the code revision recorded) and with a fold rule changed
(every run's fold differs from its projection: each is named). Printed: the runs
checked, seconds and runs per second of each check, the verdicts, and one JSON line.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from es_agents.adapters.kafka_admin import ensure_topics
from es_agents.app import build_projector
from es_agents.client import Client
from es_agents.core.events import StatePatched
from es_agents.core.state import RunState
from es_agents.lab.bench import GateLoop, append_paused, scratch_settings
from es_agents.upgrade import check


@contextmanager
def _changed_fold() -> Iterator[None]:
    """The fold with ``state_patched`` counted into the run's step as well: a rule
    changed under runs in flight (the reducer's source untouched)."""
    import importlib  # noqa: PLC0415

    folding = importlib.import_module("es_agents.core.fold")
    patched = folding._apply.dispatch(StatePatched)

    def also_a_step(event: StatePatched, state: RunState) -> None:
        patched(event, state)
        state.step += 1

    folding._apply.register(StatePatched, also_a_step)
    try:
        yield
    finally:
        folding._apply.register(StatePatched, patched)


def _timed(client: Client, runs: int) -> tuple[float, Counter[str], int]:
    started = time.perf_counter()
    verdicts = list(check(client, GateLoop(), limit=runs))
    seconds = time.perf_counter() - started
    decisions = Counter(v.decision for v in verdicts)
    return seconds, decisions, sum(1 for v in verdicts if v.differs)


def bench_upgrade(
    runs: int, length: int, partitions: int, echo: Callable[[str], None]
) -> dict[str, Any]:
    with scratch_settings(partitions) as settings:
        ensure_topics(settings.kafka)
        t0 = time.perf_counter()
        append_paused(settings, runs, length)
        build_projector(settings, batch_size=5000).run(
            until_caught_up=True, idle_seconds=0.5
        )
        set_up = time.perf_counter() - t0
        echo(f"{runs:,} paused runs of {length} events written and projected "
             f"in {set_up:.1f} s")  # fmt: skip
        with Client(settings) as client:
            same_s, same, same_differ = _timed(client, runs)
            echo(f"check, same code: {same_s:.1f} s ({runs / same_s:,.0f} runs/s), "
                 f"{dict(same)}, {same_differ} fold otherwise")  # fmt: skip
            with _changed_fold():
                changed_s, changed, changed_differ = _timed(client, runs)
            echo(f"check, a fold rule changed: {changed_s:.1f} s "
                 f"({runs / changed_s:,.0f} runs/s), {changed_differ} of "
                 f"{sum(changed.values()):,} named as folding otherwise")  # fmt: skip
    summary: dict[str, Any] = {
        "bench": "upgrade",
        "runs": runs,
        "events_per_run": length,
        "partitions": partitions,
        "set_up_s": round(set_up, 1),
        "check_s": round(same_s, 2),
        "check_runs_per_s": round(runs / same_s),
        "decisions": dict(same),
        "differ_same_code": same_differ,
        "check_changed_fold_s": round(changed_s, 2),
        "differ_changed_fold": changed_differ,
        "checked_changed_fold": sum(changed.values()),
    }
    echo(json.dumps(summary))
    return summary
