"""``es-agents bench flow``: many starts against a limit of active runs.

``--runs`` starts are sent at once to an agent whose runs may be at most
``--limit`` active (``ES_AGENTS_MAX_ACTIVE``), served by two worker processes with a
projector (a group session timeout of 6 s); every ``--high-every``-th start has
priority 1, the rest 0. Once a third of the runs completed, one worker is SIGKILLed
and a new one started. Then:

- **active, from the log**: each run's active spans read back from the events
  topic -- from its first step (or its ``admitted`` resumption) to its pause for a
  place or its end -- and the most that overlap at any time (event times, ms);
- **active, sampled**: the places held (``flow_places``) every 20 ms;
- **order**: the queue and the places sampled every 20 ms, and each pair of runs
  queued together whose places were given against the queue's order (priority,
  then arrival) by more than ``ORDER_SLACK_MS`` (the database's clock);
- **completion**: every run completed, with exactly one ``run_started``;
- the mean wait for a place of priority 1 and of priority 0.
"""

from __future__ import annotations

import asyncio
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

import psycopg
from pydantic import BaseModel, JsonValue

from es_agents.app import build_ports
from es_agents.core import RunState
from es_agents.core.commands import StartRun
from es_agents.core.events import (
    Interrupted,
    ModelCallRequested,
    Resumed,
    RunCompleted,
    RunStarted,
    ToolCallRequested,
)
from es_agents.core.flow import ADMITTED, QUEUED
from es_agents.core.step import CallTool, Finish, Step
from es_agents.lab.bench import scratch_settings, worker_env
from es_agents.settings import Settings
from es_agents.tools import ToolContext, tool

ORDER_SLACK_MS = 250
STEPS = 3  # tool calls per run


class _NoArgs(BaseModel):
    pass


@tool(_NoArgs, name="pause", side_effect=False)
async def pause(args: _NoArgs, ctx: ToolContext) -> JsonValue:
    """Takes 10 ms, so that a run lasts long enough for others to queue."""
    await asyncio.sleep(0.01)
    return {"ok": True}


class Limited:
    """``STEPS`` tool calls, then done."""

    name = "flow-bench"
    model = None
    tools = {pause.name: pause}  # noqa: RUF012 - read-only

    def plan(self, state: RunState) -> Step:
        if state.tool_calls < STEPS:
            return CallTool(f"c{state.tool_calls}", "pause", {})
        return Finish({"ok": True})

    def versions(self) -> dict[str, str | int]:
        return {"agent_version": "flow-bench@1"}


agent = Limited()
AGENT = "es_agents.lab.bench_flow:agent"


def _process(
    settings: Settings, log: Path, *argv: str, **env: str
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "es_agents.cli", *argv],
        env=worker_env(settings, **env),
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
    )


class _Sampler:
    """Every 20 ms: the places held and the queue, (priority, arrival) per run."""

    def __init__(self, settings: Settings) -> None:
        self._url = settings.database_url.get_secret_value()
        self._prefix = settings.kafka.topic_prefix
        self.places: list[int] = []
        # When each run was given a place (ms): a run can take one again later.
        self.given: dict[str, set[int]] = defaultdict(set)
        # The queue as each sample saw it, with the sample's time (ms).
        self.queues: list[tuple[int, list[tuple[str, int, int]]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        with psycopg.connect(self._url, autocommit=True) as conn:
            while not self._stop.wait(0.02):
                at = int(time.time() * 1000)
                held = conn.execute(
                    "SELECT run_id, since FROM flow_places WHERE topic_prefix = %s",
                    (self._prefix,),
                ).fetchall()
                self.places.append(len(held))
                for run_id, since in held:
                    self.given[run_id].add(int(since.timestamp() * 1000))
                queue = conn.execute(
                    "SELECT run_id, priority, seq FROM flow_queue "
                    "WHERE topic_prefix = %s",
                    (self._prefix,),
                ).fetchall()
                self.queues.append((at, [(r, int(p), int(s)) for r, p, s in queue]))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def _completed(settings: Settings) -> int:
    with psycopg.connect(settings.database_url.get_secret_value()) as conn:
        row = conn.execute(
            "SELECT count(*) FROM runs WHERE agent = %s AND status = 'completed'",
            (agent.name,),
        ).fetchone()
    return int(row[0]) if row else 0


def _until(check: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"not within {seconds:.0f} s: {what}")
        time.sleep(0.1)


class _Spans:
    """What the log says of each run: its active spans, when it was let in, how
    often it started and whether it completed."""

    def __init__(self, settings: Settings) -> None:
        ports = build_ports(settings)
        log = ports.log
        self.spans: list[tuple[int, int]] = []
        self.admitted: dict[str, int] = {}
        self.queued_at: dict[str, int] = {}
        self.starts: Counter[str] = Counter()
        self.completed: set[str] = set()
        opened: dict[str, int] = {}
        try:
            topic = settings.kafka.events_topic
            for partition in range(log.partition_count()):
                for record in log.read_partition(topic, partition):
                    self._read(log.decode_event(record.value), opened)
        finally:
            ports.close()

    def _read(self, event: object, opened: dict[str, int]) -> None:
        run = getattr(event, "run_id", "")
        ms = int(getattr(event, "at").timestamp() * 1000)  # noqa: B009
        if isinstance(event, RunStarted):
            self.starts[run] += 1
            return
        if isinstance(event, Interrupted) and event.reason == QUEUED:
            self.queued_at.setdefault(run, ms)
            if run in opened:
                self.spans.append((opened.pop(run), ms))
            return
        if isinstance(event, Resumed) and event.reason == ADMITTED:
            self.admitted.setdefault(run, ms)
            opened[run] = ms
            return
        if isinstance(event, RunCompleted):
            self.completed.add(run)
            self.spans.append((opened.pop(run, ms), ms))
            return
        stepped = isinstance(event, ToolCallRequested | ModelCallRequested)
        if stepped and run not in opened:
            opened[run] = ms  # its first step, with a place taken at once

    def most_active(self) -> int:
        edges = sorted(
            [(start, 1) for start, _ in self.spans]
            + [(end, -1) for _, end in self.spans],
            key=lambda e: (e[0], e[1]),  # at one time, ends before starts
        )
        now = most = 0
        for _, change in edges:
            now += change
            most = max(most, now)
        return most


def _order_violations(
    queues: list[tuple[int, list[tuple[str, int, int]]]], given: dict[str, set[int]]
) -> int:
    """Pairs seen queued together whose places were then given against the queue's
    order: for each, the first place it was given after the sample that saw it
    queued (a run that ends an activation waiting for something else gives its
    place back and queues again later, behind who is there then)."""

    def after(run: str, at: int) -> int | None:
        return min(
            (g for g in given.get(run, ()) if g >= at - ORDER_SLACK_MS), default=None
        )

    bad: set[tuple[str, str]] = set()
    for at, queue in queues:
        ordered = sorted(queue, key=lambda q: (-q[1], q[2]))
        for i, (first, _, _) in enumerate(ordered):
            for later, _, _ in ordered[i + 1 : i + 40]:
                a, b = after(first, at), after(later, at)
                if a is not None and b is not None and b + ORDER_SLACK_MS < a:
                    bad.add((first, later))
    return len(bad)


def bench_flow(  # noqa: PLR0917 - the bench's own parameters
    runs: int,
    limit: int,
    high_every: int,
    partitions: int,
    kill: bool,
    echo: Callable[[str], None],
) -> dict[str, object]:
    logs = Path(tempfile.mkdtemp(prefix="es-bench-flow-"))
    with scratch_settings(partitions=partitions) as scratch:
        # The killed worker's partitions move after its session times out: 6 s,
        # as on a cluster tuned for it (the default, 45 s, would be most of the run).
        kafka = scratch.kafka.model_copy(update={"session_timeout_ms": 6000})
        settings = scratch.model_copy(update={"kafka": kafka})
        build_ports(settings).close()  # the tables, before the processes start
        limited = {"ES_AGENTS_MAX_ACTIVE": str(limit)}
        procs = [
            _process(settings, logs / "projector.log", "projector"),
            _process(settings, logs / "w1.log", "worker", "--agent", AGENT, **limited),
            _process(settings, logs / "w2.log", "worker", "--agent", AGENT, **limited),
        ]
        sampler = _Sampler(settings)
        started = time.monotonic()
        try:
            ports = build_ports(settings)
            try:
                tag = uuid.uuid4().hex[:6]
                ports.log.send_all(
                    [
                        StartRun(
                            run_id=f"flow-{tag}-{n:05d}",
                            agent=agent.name,
                            priority=1 if high_every and n % high_every == 0 else 0,
                        )
                        for n in range(runs)
                    ]
                )
            finally:
                ports.close()
            echo(f"  {runs:,} starts sent; at most {limit} active")
            killed = False
            if kill:
                _until(lambda: _completed(settings) >= runs // 3, 600, "a third done")
                procs[1].send_signal(signal.SIGKILL)
                procs[1].wait(10)
                procs.append(
                    _process(
                        settings, logs / "w3.log", "worker", "--agent", AGENT, **limited
                    )
                )
                killed = True
                echo("  worker 1 SIGKILLed after a third completed; worker 3 started")
            _until(lambda: _completed(settings) >= runs, 900, "every run completed")
            took = time.monotonic() - started
        finally:
            sampler.stop()
            for p in procs:
                if p.poll() is None:
                    p.terminate()
            for p in procs:
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
        seen = _Spans(settings)
    waits: dict[int, list[int]] = defaultdict(list)
    for run, at in seen.admitted.items():
        priority = (
            1 if high_every and int(run.rsplit("-", 1)[1]) % high_every == 0 else 0
        )
        waits[priority].append(at - seen.queued_at.get(run, at))
    summary: dict[str, object] = {
        "store": settings.store,
        "runs": runs,
        "limit": limit,
        "partitions": partitions,
        "worker_killed": killed,
        "seconds": round(took, 1),
        "completed": len(seen.completed),
        "started_twice": sum(1 for n in seen.starts.values() if n != 1),
        "queued": len(seen.queued_at),
        "most_active_from_log": seen.most_active(),
        "most_places_sampled": max(sampler.places, default=0),
        "samples": len(sampler.places),
        "order_violations": _order_violations(sampler.queues, sampler.given),
        "wait_ms_mean_priority_1": round(statistics.fmean(waits[1]), 1)
        if waits[1]
        else None,
        "wait_ms_mean_priority_0": round(statistics.fmean(waits[0]), 1)
        if waits[0]
        else None,
    }
    echo(
        f"  {summary['completed']:,} of {runs:,} completed in {summary['seconds']} s; "
        f"most active {summary['most_active_from_log']} (from the log), "
        f"{summary['most_places_sampled']} (places, {summary['samples']} samples); "
        f"{summary['queued']:,} queued; {summary['order_violations']} let in out "
        f"of order; {summary['started_twice']} started other than once; mean wait "
        f"{summary['wait_ms_mean_priority_1']} ms at priority 1, "
        f"{summary['wait_ms_mean_priority_0']} ms at 0"
    )
    echo(json.dumps(summary))
    return summary
