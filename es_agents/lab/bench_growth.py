"""``es-agents bench growth``: what a long run leaves behind, and what resuming costs.

Two runs on the real stack, each through an in-process worker and projector:

* a chat agent of ``--chat-steps`` steps (a scripted model calls a tool on every
  turn; each message is about 200 bytes), and
* a research agent of ``--tool-calls`` model calls whose tool returns 5 KB each, so
  the conversation the model is sent grows by 5 KB a turn.

Each run stops at a gate a tenth of the way in and at gates near its end. At each
stop the bench waits for the projector and measures the log's bytes per step (key,
value and headers of the run's records), the Postgres bytes of the projections
(``pg_total_relation_size``: tables with their indexes and TOAST), and the latest
snapshot's size. Per-step figures compare the first tenth of the run with the rest
(linear storage: the two agree). At the end, each approval's resume is timed
(command sent -> the next step acknowledged), and so is a 10-event run's.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from pydantic import BaseModel, JsonValue

from es_agents.agent import ToolAgent
from es_agents.app import build_ports, build_projector, build_worker
from es_agents.core.budget import Budget
from es_agents.core.commands import Approve, StartRun
from es_agents.core.state import RunState
from es_agents.core.step import Interrupt, Step
from es_agents.lab.bench import approvals, scratch_settings
from es_agents.models import ScriptedModel, call, reply
from es_agents.ports import Ports
from es_agents.settings import Settings
from es_agents.tools import Tool, ToolContext, tool

_TABLES = ("runs", "run_events", "run_tails", "run_snapshots", "run_transcripts")


class Note(BaseModel):
    note: str


@tool(Note, side_effect=False)
def jot(args: Note, ctx: ToolContext) -> JsonValue:
    """Echoes a note back (a chat turn's tool)."""
    return {"noted": args.note}


class Query(BaseModel):
    q: str


@tool(Query, side_effect=False)
def fetch_page(args: Query, ctx: ToolContext) -> JsonValue:
    """Returns a 5 KB page (the research agent's tool)."""
    return {"q": args.q, "page": ("lorem ipsum dolor sit amet " * 200)[:5000]}


class Stops:
    """An agent that stops at a gate at each of ``at`` steps, then goes on as
    ``inner`` would; approving a stop is a resume."""

    def __init__(self, inner: ToolAgent, at: list[int]) -> None:
        self.inner = inner
        self.at = at
        self.name = inner.name

    @property
    def tools(self) -> Mapping[str, Tool[Any]]:
        return self.inner.tools

    @property
    def model(self) -> Any:
        return self.inner.model

    @property
    def budget(self) -> Budget:
        return self.inner.budget  # unlimited: runs as long as the bench asks

    def versions(self) -> dict[str, str | int]:
        return self.inner.versions()

    def plan(self, state: RunState) -> Step:
        for step in self.at:
            gate = f"at-{step}"
            if state.step >= step and gate not in state.gate_decisions:
                return Interrupt(reason="awaiting_approval", gate=gate)
        return self.inner.plan(state)


def _chat(steps: int) -> ToolAgent:
    note = "n" * 150
    turns = steps // 2
    script = [call("jot", f"c{n}", note=f"{n}:{note}") for n in range(turns - 1)]
    script.append(reply("done"))
    return ToolAgent(
        name="bench-chat",
        system_prompt="Jot a note on every turn.",
        model=ScriptedModel(script, model_id="scripted-chat"),
        tool_list=[jot],
        budget=Budget.unlimited(),  # runs as long as the bench asks
    )


def _research(calls: int) -> ToolAgent:
    script = [call("fetch_page", f"r{n}", q=f"query {n}") for n in range(calls - 1)]
    script.append(reply("summary"))
    return ToolAgent(
        name="bench-research",
        system_prompt="Fetch a page per turn, then summarize.",
        model=ScriptedModel(script, model_id="scripted-research"),
        tool_list=[fetch_page],
        budget=Budget.unlimited(),  # runs as long as the bench asks
    )


@dataclass
class Measure:
    step: int
    log_bytes: int
    db_bytes: int
    snapshot_bytes: int
    snapshots: int
    payload_bytes: int  # the transcript's messages as JSON: what the run carries


def _db_bytes(conn: psycopg.Connection[Any]) -> int:
    total = 0
    for table in _TABLES:
        row = conn.execute(
            "SELECT coalesce(pg_total_relation_size(to_regclass(%s)), 0)", (table,)
        ).fetchone()
        total += int(row[0]) if row else 0
    return total


def _measure(settings: Settings, ports: Ports, run_id: str) -> Measure:
    log = ports.log
    partition = log.partition_for(run_id)
    log_bytes = 0
    step = 0
    for record in log.read_partition(settings.kafka.events_topic, partition):
        if record.key == run_id:
            log_bytes += len(record.key) + len(record.value)
            log_bytes += sum(len(k) + len(v) for k, v in record.headers)
    url = settings.database_url.get_secret_value()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM")  # dead rows' space marked free for reuse
        db_bytes = _db_bytes(conn)
        payload = conn.execute(
            "SELECT coalesce(sum(octet_length(messages::text)), 0) "
            "FROM run_transcripts WHERE run_id = %s",
            (run_id,),
        ).fetchone()
        row = conn.execute(
            "SELECT coalesce(max(octet_length(state::text)), 0), count(*) "
            "FROM run_snapshots WHERE run_id = %s",
            (run_id,),
        ).fetchone()
        status = conn.execute(
            "SELECT step FROM runs WHERE run_id = %s", (run_id,)
        ).fetchone()
    step = int(status[0]) if status else 0
    return Measure(
        step,
        log_bytes,
        db_bytes,
        int(row[0]) if row else 0,
        int(row[1]) if row else 0,
        int(payload[0]) if payload else 0,
    )


def _wait_paused(ports: Ports, run_id: str, step: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        row = ports.projections.run_row(run_id)
        if (
            row is not None
            and row.get("status") == "paused"
            and int(str(row.get("step", 0))) >= step
        ):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{run_id}: not paused at step {step}: {row}")
        time.sleep(0.05)


def _resume_ms(ports: Ports, worker: Any, run_id: str, at: int) -> float:
    """Approve the stop at step ``at``: milliseconds to the next step durable."""
    _wait_paused(ports, run_id, at, 120)
    return approvals(worker, ports.log, run_id, 1)[0]


@contextmanager
def _serving(
    settings: Settings, agent: Any, warm: bool = False
) -> Iterator[tuple[Ports, Any]]:
    """A projector and a worker for ``agent``, each in a thread, until the end.
    Not ``warm``: the worker keeps no paused run loaded, so each approval times the
    load (snapshot, events, the log's tail) as a worker that did not pause the run
    pays it."""
    ports = build_ports(settings)
    projector = build_projector(settings, batch_size=2000)
    worker = build_worker(
        settings if warm else settings.model_copy(update={"warm_runs": 0}), agent
    )
    threads = [
        threading.Thread(target=projector.run, daemon=True),
        threading.Thread(target=worker.run, daemon=True),
    ]
    for thread in threads:
        thread.start()
    try:
        yield ports, worker
    finally:
        worker.stop()
        projector.stop()
        for thread in threads:
            thread.join(30)
        ports.close()


def stops_for(steps: int, resumes: int) -> tuple[int, list[int]]:
    """Where a run of ``steps`` steps stops: once early (a tenth in, at least step
    2), then ``resumes`` + 1 times two steps apart before its end -- fewer when the
    run is too short for them all (at least one resume)."""
    if steps < 8:
        raise ValueError(f"a run of {steps} steps is too short to measure: 8 at least")
    early = max(2, steps // 10)
    room = (steps - early - 2) // 2  # stops that fit after the early one
    resumes = max(1, min(resumes, room - 1))
    return early, [steps - 2 * (resumes + 1) + 2 * n for n in range(resumes + 1)]


def _one(
    settings: Settings,
    agent: ToolAgent,
    steps: int,
    resumes: int,
    echo: Callable[[str], None],
) -> dict[str, object]:
    early, late = stops_for(steps, resumes)
    resumes = len(late) - 1
    stops = Stops(agent, [early, *late])
    run_id = f"growth-{agent.name}-{uuid.uuid4().hex[:6]}"
    with _serving(settings, stops) as (ports, worker):
        empty = _measure(settings, ports, run_id)  # the tables before the run
        started = time.perf_counter()
        ports.log.send(StartRun(run_id=run_id, agent=agent.name))
        _wait_paused(ports, run_id, early, 120)
        first = _measure(settings, ports, run_id)
        ports.log.send(Approve(run_id=run_id, by="bench"))
        _wait_paused(ports, run_id, late[0], 3600)
        took = time.perf_counter() - started
        last = _measure(settings, ports, run_id)
        times = [_resume_ms(ports, worker, run_id, at) for at in late[:resumes]]
    rest = max(last.step - first.step, 1)
    base = empty.db_bytes
    result: dict[str, object] = {
        "steps": last.step,
        "seconds": round(took, 1),
        "log_bytes_per_step_start": round(first.log_bytes / max(first.step, 1)),
        "log_bytes_per_step_end": round((last.log_bytes - first.log_bytes) / rest),
        "db_bytes_per_step_start": round((first.db_bytes - base) / max(first.step, 1)),
        "db_bytes_per_step_end": round((last.db_bytes - first.db_bytes) / rest),
        "snapshot_bytes_start": first.snapshot_bytes,
        "snapshot_bytes_end": last.snapshot_bytes,
        "snapshots_kept": last.snapshots,
        "payload_bytes_per_step": round(last.payload_bytes / max(last.step, 1)),
        "log_bytes_total": last.log_bytes,
        "db_bytes_total": last.db_bytes - base,
        "resume_ms_median": round(statistics.median(times), 2),
    }
    echo(
        f"{agent.name}: {last.step} steps in {took:.1f} s; log bytes/step "
        f"{result['log_bytes_per_step_start']} (first {first.step} steps) -> "
        f"{result['log_bytes_per_step_end']} (the rest); Postgres bytes/step "
        f"{result['db_bytes_per_step_start']} -> {result['db_bytes_per_step_end']}; "
        f"(messages {result['payload_bytes_per_step']} bytes/step); "
        f"latest snapshot {first.snapshot_bytes} -> {last.snapshot_bytes} bytes "
        f"({last.snapshots} kept); resume at the end "
        f"{result['resume_ms_median']} ms (median of {resumes})"
    )
    return result


def _short_resume(
    settings: Settings, resumes: int, echo: Callable[[str], None], warm: bool = False
) -> float:
    """A run of 10 events (the chat agent stopped at step 4), resumed ``resumes``
    times: each approval is one more step, to the next stop. ``warm``: in the
    worker that paused it, which still holds it (``ES_AGENTS_WARM_RUNS``)."""
    agent = Stops(_chat(100), [4 + 2 * n for n in range(resumes + 1)])
    run_id = f"growth-short-{uuid.uuid4().hex[:6]}"
    with _serving(settings, agent, warm) as (ports, worker):
        ports.log.send(StartRun(run_id=run_id, agent=agent.name))
        _wait_paused(ports, run_id, 4, 120)
        row = ports.projections.run_row(run_id) or {}
        times = [_resume_ms(ports, worker, run_id, 4)]
        times += [_resume_ms(ports, worker, run_id, 6 + 2 * n) for n in range(resumes)]
    ms = round(statistics.median(times), 2)
    echo(
        f"a run of {int(str(row.get('last_seq', 0))) + 1} events: resume {ms} ms "
        f"(median of {resumes}{', in the worker that paused it' if warm else ''})"
    )
    return ms


def bench_growth(
    chat_steps: int, tool_calls: int, resumes: int, echo: Callable[[str], None]
) -> dict[str, object]:
    with scratch_settings(partitions=1) as settings:
        echo(
            f"fencing: {settings.fencing}; K={settings.snapshot_every}; "
            f"single broker, page cache"
        )
        chat = _one(settings, _chat(chat_steps), chat_steps, resumes, echo)
        research = _one(settings, _research(tool_calls), 2 * tool_calls, resumes, echo)
        short = _short_resume(settings, resumes, echo)
        short_warm = _short_resume(settings, resumes, echo, warm=True)
    result: dict[str, object] = {
        "chat": chat,
        "research": research,
        "short_run_resume_ms": short,
        "short_run_warm_resume_ms": short_warm,
        "fencing": settings.fencing,
        "snapshot_every": settings.snapshot_every,
    }
    echo(json.dumps(result))
    return result
