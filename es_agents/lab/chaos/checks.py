"""The chaos run's invariant checks, on the log as read back after the heal."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from es_agents.core import RunState
from es_agents.core.events import Event, ModelCallRequested, ModelResponded
from es_agents.lab.ack_journal import read_journal
from es_agents.lab.chaos.processes import Child


def check_acks(
    work: Path, runs: dict[str, list[Event]], violations: dict[str, list[str]]
) -> int:
    """Checks every journaled acknowledgement; returns how many there were."""
    path = work / "acks.log"
    if not path.exists():
        return 0
    ids = {(e.run_id, e.seq): e.event_id for es in runs.values() for e in es}
    acks = 0
    for acked in read_journal(path):
        acks += 1
        found = ids.get((acked.run_id, acked.seq))
        if found != acked.event_id:
            violations["lost_acknowledged_event"].append(
                f"{acked.run_id} seq {acked.seq}: acknowledged {acked.event_id}, "
                f"log has {found}"
            )
    return acks


def check_model_calls(
    work: Path, runs: dict[str, list[Event]], violations: dict[str, list[str]]
) -> int:
    """Each issued call has a durable request; none follows a recorded response."""
    requested: Counter[str] = Counter()
    reissued = 0
    for run_id, events in runs.items():
        answered: set[str] = set()
        pending: str | None = None
        for event in events:
            if isinstance(event, ModelCallRequested):
                if event.messages_hash in answered:
                    violations["completion_reissued"].append(
                        f"{run_id} seq {event.seq}: {event.messages_hash[:19]}"
                    )
                requested[event.messages_hash] += 1
                reissued += event.attempt > 1
                pending = event.messages_hash
            elif isinstance(event, ModelResponded) and pending is not None:
                answered.add(pending)
                pending = None
    path = work / "model-calls.jsonl"
    issued: Counter[str] = Counter()
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                issued[json.loads(line)["hash"]] += 1
            except (ValueError, KeyError):
                continue  # a torn last line of a killed process
    for digest, count in issued.items():
        if count > requested[digest]:
            violations["model_call_without_request"].append(
                f"{digest[:19]}: issued {count}, requested {requested[digest]}"
            )
    return reissued


def check_projection(
    database_url: str,
    projector: Child,
    states: dict[str, RunState],
    runs: dict[str, list[Event]],
    violations: dict[str, list[str]],
) -> None:
    """The projection converges on the fold (the projector may still be behind
    right after the heal: it gets 60 s)."""
    want = {
        run_id: (s.status, s.step, s.seq, s.waiting.reason if s.waiting else None)
        for run_id, s in states.items()
    }
    counts = {run_id: len(events) for run_id, events in runs.items()}
    projector.start()  # the projector was stopped with the workers
    deadline = time.monotonic() + 60
    mismatched: list[str] = []
    try:
        while True:
            with psycopg.connect(database_url) as conn:
                rows = conn.execute(
                    "SELECT r.run_id, r.status, r.step, r.last_seq, "
                    "r.waiting_reason, (SELECT count(*) FROM run_events e "
                    "WHERE e.run_id = r.run_id) FROM runs r"
                ).fetchall()
            got = {r[0]: (r[1], r[2], r[3], r[4]) for r in rows}
            got_counts = {r[0]: r[5] for r in rows}
            mismatched = [
                f"{run_id}: projection {got.get(run_id)} "
                f"({got_counts.get(run_id)} events), "
                f"fold {fold_row} ({counts[run_id]} events)"
                for run_id, fold_row in want.items()
                if got.get(run_id) != fold_row
                or got_counts.get(run_id) != counts[run_id]
            ]
            extra = set(got) - set(want)
            mismatched += [f"{run_id}: projected, not in the log" for run_id in extra]
            if not mismatched or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    finally:
        projector.stop()
    violations["projection_differs_from_fold"] += mismatched
    if not mismatched:
        violations.pop("projection_differs_from_fold")


def print_report(
    echo: Callable[[str], None],
    timeline: list[str],
    report: dict[str, Any],
    violations: dict[str, list[str]],
) -> None:
    echo("\nfaults:")
    for line in timeline:
        echo(f"  {line}")
    outcomes = ", ".join(f"{k} {v}" for k, v in sorted(report["outcomes"].items()))
    echo(f"\nruns: {report['runs']} ({outcomes})")
    echo(
        f"steps: {report['steps']} ({report['events']} events, "
        f"{report['steps_per_s']} steps/s over the whole run)"
    )
    echo(
        "faults injected: "
        + ", ".join(f"{k} {v}" for k, v in sorted(report["faults_injected"].items()))
        + f" (of {report['faults_scheduled']} scheduled)"
    )
    echo(
        "process exits: "
        + "; ".join(
            f"{kind}: " + ", ".join(f"{how} {n}" for how, n in sorted(by.items()))
            for kind, by in report["process_exits"].items()
        )
    )
    echo(
        f"effects: {report['effects']}; reconciled tool calls "
        f"{report['reconciled_tool_calls']}; dangling model calls re-issued "
        f"{report['dangling_model_calls_reissued']}; charge re-sends absorbed "
        f"downstream {report['charge_resends_absorbed_downstream']}; "
        "calls refused by fencing token "
        f"{report['calls_refused_by_fencing_token']}; "
        f"acknowledgements checked {report['acknowledgements_checked']}"
    )
    for fault in report.get("broker_faults", []):
        echo(
            f"broker {fault['broker']} killed at {fault['at_s']:.1f} s: the longest "
            f"stall of a run that began while it was down, {fault['stall_s']:.1f} s"
        )
    for stall in report.get("longest_stalls", []):
        echo(
            f"stall of {stall['s']:.1f} s at {stall['at_s']:.1f} s: run "
            f"{stall['run']} after {stall['after']}"
        )
    total = sum(len(v) for v in violations.values())
    echo(f"violations: {total}")
    for kind, items in violations.items():
        echo(f"  {kind}: {len(items)}")
        for item in items[:10]:
            echo(f"    {item}")
    echo(json.dumps(report, sort_keys=True))
