"""``es-agents bench steps``: what one durable step costs, against raw Kafka.

A chat agent whose scripted model asks for a no-op tool on every turn runs through an
in-process worker on the real broker. Each model call and each tool call is one step:
its intention is acknowledged before the action, its outcome travels with the next
intention (one acknowledgement per step). The same number of acknowledged round trips
is then made with a bare confluent-kafka producer, same settings and record sizes.
Printed: per-step time, the raw round trip, their ratio, and the log bytes of step 10
and of the last step (the transcript is a fold, so they should not grow).
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from confluent_kafka import Producer
from psycopg import sql
from psycopg.conninfo import make_conninfo
from pydantic import BaseModel, JsonValue, SecretStr

from es_agents.agent import Agent, ToolAgent
from es_agents.app import build_ports, build_projector, build_worker, ensure_topics
from es_agents.codec import AvroCodec
from es_agents.core import RunState, replay
from es_agents.core.budget import Budget
from es_agents.core.commands import Approve, StartRun
from es_agents.core.events import Event, Interrupted, RunStarted, StatePatched
from es_agents.core.step import CallTool, Finish, Interrupt, Step
from es_agents.models import ScriptedModel, call, reply
from es_agents.ports import EventLog
from es_agents.runtime.worker import Worker
from es_agents.settings import Settings, load_settings
from es_agents.tools import ToolContext, tool
from es_agents.vault import new_master_key


class NoArgs(BaseModel):
    pass


@tool(NoArgs, side_effect=False)
async def noop(args: NoArgs, ctx: ToolContext) -> JsonValue:
    """Does nothing: the step costs only the protocol."""
    return {"ok": True}


@tool(NoArgs, name="noop", side_effect=False)
def noop_sync(args: NoArgs, ctx: ToolContext) -> JsonValue:
    """Does nothing, as a plain function: run on a thread of the call pool."""
    return {"ok": True}


def chat_agent(steps: int) -> ToolAgent:
    turns = steps // 2
    script = [call("noop", f"call-{n}") for n in range(turns - 1)]
    script.append(reply("done"))
    return ToolAgent(
        name="bench",
        system_prompt="Call noop until told to stop.",
        model=ScriptedModel(script, model_id="scripted-bench"),
        tool_list=[noop],
        budget=Budget.unlimited(),  # runs as long as the bench asks
    )


class ToolLoop:
    """A planner with no model: ``steps`` no-op tool calls, then finish."""

    name = "bench"

    def __init__(self, steps: int, sync: bool = False) -> None:
        self.steps = steps
        self.model = None
        self.tools = {"noop": noop_sync if sync else noop}

    def plan(self, state: RunState) -> Step:
        if state.tool_calls >= self.steps:
            return Finish({"tool_calls": state.tool_calls})
        return CallTool(f"c{state.tool_calls}", "noop", {})

    def versions(self) -> dict[str, str | int]:
        return {"agent_version": "bench-tool-loop@1"}


def _run(settings: Settings, agent: Agent) -> tuple[list[Event], list[float], float]:
    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    ports = build_ports(settings)
    try:
        ports.log.send(StartRun(run_id=run_id, agent="bench"))
        worker = build_worker(settings, agent, until_idle=True, idle_seconds=0.3)
        started = time.perf_counter()
        worker.run()
        wall = time.perf_counter() - started
        events = ports.log.read_run(run_id)
    finally:
        ports.close()
    state = replay(events)
    if state.status != "completed":
        raise RuntimeError(f"bench run ended {state.status}: {state.error}")
    return events, list(worker.append_ms), wall


def bench_steps(
    steps: int, echo: Callable[[str], None], fsync: bool = False
) -> dict[str, object]:
    with scratch_settings(partitions=1, fsync=fsync) as settings:
        return _bench_steps(settings, steps, echo)


def _bench_steps(
    settings: Settings, steps: int, echo: Callable[[str], None]
) -> dict[str, object]:
    codec = AvroCodec()

    # 1. The protocol alone: no-op tool steps, no model, no transcript; unfenced
    # (idempotent appends), fenced by epochs in the log (the default) and, on Kafka,
    # fenced by one transaction per append (the other option).
    kinds = ["none", "epochs", "transactions"] if settings.store == "kafka" else []
    per_step: dict[str, float] = {}
    ack_p50: dict[str, float] = {}
    for kind in kinds or ["none", "epochs"]:
        events, acks, _ = _run(
            settings.model_copy(update={"fencing": kind}), ToolLoop(steps)
        )
        elapsed = (events[-1].at - events[0].at).total_seconds() * 1000
        per_step[kind] = elapsed / steps
        ack_p50[kind] = statistics.median(acks)

    # 1b. Fenced, the no-op tool a plain function (on a thread of the call pool:
    # two thread hand-offs a step) instead of an ``async def`` one.
    events, sync_acks, _ = _run(settings, ToolLoop(steps, sync=True))
    sync_per_step = (events[-1].at - events[0].at).total_seconds() * 1000 / steps

    # 2. A chat agent, fenced (the default): model and tool steps alternate, the
    # transcript grows.
    chat, chat_acks, _ = _run(settings, chat_agent(steps))
    chat_steps = max(e.step for e in chat)
    chat_per_step = (chat[-1].at - chat[0].at).total_seconds() * 1000 / chat_steps
    sizes: dict[int, int] = {}
    for event in chat:
        size = len(codec.encode(event)) + len(event.run_id)  # value + key
        sizes[event.step] = sizes.get(event.step, 0) + size
    last = chat_steps - 1  # the final step also carries run_completed

    # 2b. The same chat agent with its payloads encrypted (a data key per run).
    sealed_settings = settings.model_copy(
        update={"master_key": SecretStr(new_master_key())}
    )
    sealed, sealed_acks, _ = _run(
        sealed_settings, dataclasses.replace(chat_agent(steps), encrypted=True)
    )
    sealed_per_step = (sealed[-1].at - sealed[0].at).total_seconds() * 1000 / chat_steps
    sealed_bytes = sum(len(codec.encode(e)) for e in sealed if e.step == 10)

    # 3. The bare store, same settings: two records per acknowledged write.
    record = b"x" * int(statistics.mean(sizes.values()) / 2)
    raw_p50 = statistics.median(_raw_writes(settings, record, steps))

    fenced = "epochs"
    result: dict[str, object] = {
        "store": settings.store,
        "steps": steps,
        "fencing": settings.fencing,
        "tool_step_ms": round(per_step[fenced], 3),
        "append_ack_ms_p50": round(ack_p50[fenced], 3),
        "sync_tool_step_ms": round(sync_per_step, 3),
        "sync_tool_append_ack_ms_p50": round(statistics.median(sync_acks), 3),
        "raw_produce_flush_ms_p50": round(raw_p50, 3),
        "ack_ratio_framework_to_raw": round(ack_p50[fenced] / raw_p50, 2),
        "step_ratio_framework_to_raw": round(per_step[fenced] / raw_p50, 2),
        "unfenced_tool_step_ms": round(per_step["none"], 3),
        "unfenced_append_ack_ms_p50": round(ack_p50["none"], 3),
        "chat_step_ms": round(chat_per_step, 3),
        "chat_append_ack_ms_p50": round(statistics.median(chat_acks), 3),
        "encrypted_chat_step_ms": round(sealed_per_step, 3),
        "encrypted_chat_append_ack_ms_p50": round(statistics.median(sealed_acks), 3),
        "encryption_step_overhead_ms": round(sealed_per_step - chat_per_step, 3),
        "encrypted_bytes_step_10": sealed_bytes,
        "bytes_step_10": sizes.get(10),
        f"bytes_step_{last}": sizes.get(last),
        "durability": _durability(settings),
    }
    if "transactions" in per_step:
        result["transactions_tool_step_ms"] = round(per_step["transactions"], 3)
        result["transactions_commit_ms_p50"] = round(ack_p50["transactions"], 3)
    echo(f"store: {settings.store} ({result['durability']})")
    for kind, ms in per_step.items():
        label = {
            "none": "unfenced (ES_AGENTS_FENCING=none)",
            "epochs": "fenced by epochs in the log (the default)",
            "transactions": "fenced by a transaction per append",
        }[kind]
        if settings.store != "kafka" and kind == "epochs":
            label = "fenced (the epoch checked in the append's transaction)"
        echo(
            f"{steps} no-op tool steps, {label}: {ms:.3f} ms per step, "
            f"append p50 {ack_p50[kind]:.3f} ms"
        )
    echo(
        f"{steps} no-op tool steps, fenced, the tool a plain function (on the "
        f"call pool's threads): {sync_per_step:.3f} ms per step"
    )
    echo(
        f"bare {_RAW[settings.store]}, same settings: {raw_p50:.3f} ms p50 "
        f"(fenced ack ratio {result['ack_ratio_framework_to_raw']}, "
        f"fenced step ratio {result['step_ratio_framework_to_raw']})"
    )
    echo(
        f"chat agent, fenced, {chat_steps} steps: {chat_per_step:.3f} ms per step "
        "(includes the scripted model serializing the growing transcript)"
    )
    echo(
        f"chat agent, encrypted payloads: {sealed_per_step:.3f} ms per step "
        f"({sealed_per_step - chat_per_step:+.3f} ms), append p50 "
        f"{statistics.median(sealed_acks):.3f} ms; step 10 = {sealed_bytes} bytes"
    )
    echo(
        f"log bytes per step: step 10 = {sizes.get(10)}, "
        f"step {last} = {sizes.get(last)}"
    )
    echo(json.dumps(result))
    return result


class GateLoop:
    """Waits at gate ``g`` again every time it is approved: a resume per command."""

    name = "bench"
    model = None
    tools: dict[str, Any] = {}  # noqa: RUF012 - read-only

    def plan(self, state: RunState) -> Step:
        return Interrupt("awaiting_approval", gate="g")

    def versions(self) -> dict[str, str | int]:
        return {"agent_version": "bench-gate-loop@1"}


_RAW = {
    "kafka": "confluent-kafka produce x2 + flush",
    "postgres": "psycopg INSERT x2 + COMMIT",
}


def _raw_writes(settings: Settings, record: bytes, n: int) -> list[float]:
    """Milliseconds per write of two records straight to the store, no framework."""
    out = []
    if settings.store == "postgres":
        url = settings.database_url.get_secret_value()
        with psycopg.connect(url) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS raw_bench (k text, v bytea)")
            conn.commit()
            for _ in range(n + 1):
                started = time.perf_counter()
                with conn.cursor() as cur:
                    cur.executemany(
                        "INSERT INTO raw_bench VALUES (%s, %s)",
                        [("raw", record), ("raw", record)],
                    )
                conn.commit()
                out.append((time.perf_counter() - started) * 1000)
        return out[1:]
    kafka = settings.kafka
    producer = Producer(kafka.producer_config())
    producer.produce(kafka.events_topic, key="warm", value=record)
    producer.flush()
    for _ in range(n):
        started = time.perf_counter()
        producer.produce(kafka.events_topic, key="raw", value=record)
        producer.produce(kafka.events_topic, key="raw", value=record)
        producer.flush()
        out.append((time.perf_counter() - started) * 1000)
    return out


def _durability(settings: Settings) -> str:
    if settings.store != "postgres":
        k = settings.kafka
        brokers = (
            "single broker"
            if k.replication_factor == 1
            else f"replication factor {k.replication_factor}, "
            f"min.insync.replicas {k.min_insync_replicas}"
        )
        if k.topic_config.get("flush.messages") == "1":
            return f"acks=all, {brokers}, fsync per message (flush.messages=1)"
        return f"acks=all, {brokers}, page cache (no fsync per message)"
    with psycopg.connect(settings.database_url.get_secret_value()) as conn:
        fsync = conn.execute("SHOW fsync").fetchone()
        commit = conn.execute("SHOW synchronous_commit").fetchone()
    return (
        f"postgres commit, fsync={fsync[0] if fsync else '?'}, "
        f"synchronous_commit={commit[0] if commit else '?'}"
    )


@contextmanager
def scratch_settings(
    partitions: int, k: int | None = None, fsync: bool = False
) -> Iterator[Settings]:
    """Settings of a bench's own: a fresh topic prefix and a fresh database on the
    configured servers, both deleted afterwards (a broker that kept every bench's
    topics would grow slower to start with each). A bench never touches a user's
    data.
    ``fsync``: topics with ``flush.messages=1`` (the broker fsyncs each message
    before it acknowledges)."""
    base = load_settings()
    uid = uuid.uuid4().hex[:8]
    update: dict[str, object] = {
        "topic_prefix": f"bench-{uid}",
        "partitions": partitions,
    }
    if fsync:
        update["topic_config"] = {**base.kafka.topic_config, "flush.messages": "1"}
    kafka = base.kafka.model_copy(update=update)
    url = base.database_url.get_secret_value()
    name = f"es_bench_{uid}"
    with psycopg.connect(make_conninfo(url, dbname="postgres"), autocommit=True) as c:
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    fields = {
        **base.model_dump(),
        "kafka": kafka,
        "database_url": SecretStr(make_conninfo(url, dbname=name)),
    }
    if k is not None:
        fields["snapshot_every"] = k
    try:
        settings = Settings(**fields)
        ensure_topics(settings)
        yield settings
    finally:
        if base.store == "kafka":
            from es_agents.adapters.kafka_admin import delete_topics  # noqa: PLC0415

            delete_topics(kafka)
        with psycopg.connect(
            make_conninfo(url, dbname="postgres"), autocommit=True
        ) as c:
            c.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(name)
                )
            )


def _started(run_id: str, agent_version: str = "") -> RunStarted:
    """A bench run's first event, written straight to the log."""
    return RunStarted(
        run_id=run_id,
        seq=0,
        step=0,
        agent="bench",
        input_json="{}",
        command_id=f"start-{run_id}",
        agent_version=agent_version,
    )


def worker_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The environment of a worker or projector process on a bench's scratch
    settings (as users configure theirs: ``ES_AGENTS_*`` variables)."""
    kafka = settings.kafka
    return {
        **os.environ,
        "ES_AGENTS_STORE": settings.store,
        "ES_AGENTS_BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
        "ES_AGENTS_TOPIC_PREFIX": kafka.topic_prefix,
        "ES_AGENTS_PARTITIONS": str(kafka.partitions),
        "ES_AGENTS_SESSION_TIMEOUT_MS": str(kafka.session_timeout_ms),
        "ES_AGENTS_DATABASE_URL": settings.database_url.get_secret_value(),
        **extra,
    }


def _long_run(run_id: str, length: int) -> list[Event]:
    events: list[Event] = [_started(run_id, agent_version="bench-gate-loop@1")]
    events += [
        StatePatched(run_id=run_id, seq=n, step=0, key=f"k{n % 16}", value_json=str(n))
        for n in range(1, length - 1)
    ]
    events.append(
        Interrupted(
            run_id=run_id,
            seq=length - 1,
            step=0,
            reason="awaiting_approval",
            detail_json='{"gate":"g"}',
        )
    )
    return events


def append_paused(settings: Settings, count: int, length: int) -> list[str]:
    """``count`` runs of ``length`` events paused at gate ``g``, appended straight
    to the log in batches (a bench's set-up); their ids, ``paused-N-xxxx``."""
    ids = [f"paused-{n}-{uuid.uuid4().hex[:6]}" for n in range(count)]
    ports = build_ports(settings)
    try:
        batch: list[Event] = []
        for run_id in ids:
            batch += _long_run(run_id, length)
            if len(batch) >= 4000:
                ports.log.append(batch)
                batch = []
        if batch:
            ports.log.append(batch)
    finally:
        ports.close()
    return ids


def _in_thread(target: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


@contextmanager
def _running(worker: Worker) -> Iterator[Worker]:
    """A worker serving in a thread, owning partition 0, stopped at the end."""
    thread = _in_thread(worker.run)
    try:
        deadline = time.monotonic() + 30
        while worker.ownership.current_epoch(0) is None:
            if time.monotonic() > deadline:
                raise RuntimeError("the worker was assigned no partition")
            time.sleep(0.01)
        yield worker
    finally:
        worker.stop()
        thread.join(30)


def approvals(worker: Worker, log: EventLog, run_id: str, n: int) -> list[float]:
    """Milliseconds from each of ``n`` approvals to the next step durable (one
    append: the command's `resumed` with the next step's event)."""
    times = []
    for _ in range(n):
        before = len(worker.append_ms)
        t0 = time.perf_counter()
        log.send(Approve(run_id=run_id, by="bench"))
        deadline = t0 + 30
        while len(worker.append_ms) < before + 1:
            if time.perf_counter() > deadline:
                raise RuntimeError(f"no step for {run_id}")
            time.sleep(0.0002)
        times.append((time.perf_counter() - t0) * 1000)
    return times


def bench_resume(
    lengths: list[int], repeats: int, k: int, echo: Callable[[str], None]
) -> dict[str, object]:
    """Median time from an approve command to the next step durable, per run length."""
    with scratch_settings(partitions=1, k=k) as settings:
        return _bench_resume(settings, lengths, repeats, echo)


def _bench_resume(
    settings: Settings, lengths: list[int], repeats: int, echo: Callable[[str], None]
) -> dict[str, object]:
    ports = build_ports(settings)
    log = ports.log
    runs = {length: f"bench-{length}-{uuid.uuid4().hex[:6]}" for length in lengths}
    total = 0
    for length, run_id in runs.items():
        events = _long_run(run_id, length)
        for start in range(0, len(events), 2000):
            log.append(events[start : start + 2000])
        total += len(events)
    echo(f"wrote {total} events for runs of {', '.join(map(str, lengths))} events")
    projector = build_projector(settings, batch_size=5000)
    started = time.perf_counter()
    projector_thread = _in_thread(projector.run)
    while projector.projected < total:
        time.sleep(0.05)
    took = time.perf_counter() - started
    echo(f"projected them in {took:.1f}s (K={settings.snapshot_every})")
    results: dict[int, float] = {}
    warm_results: dict[int, float] = {}
    warm = f"bench-warm-{uuid.uuid4().hex[:6]}"
    log.append(_long_run(warm, 10))
    try:
        # Cold: every activation loads (snapshot, events, the log's tail).
        cold = settings.model_copy(update={"warm_runs": 0})
        with _running(build_worker(cold, GateLoop())) as worker:
            for length, run_id in [(0, warm), *runs.items()]:
                times = approvals(worker, log, run_id, repeats)
                if length == 0:
                    continue  # warm-up: connections, caches, the first fetch
                results[length] = statistics.median(times)
                echo(
                    f"  {length:>7} events: resume (command -> next step durable) "
                    f"{results[length]:.2f} ms median of {repeats}"
                )
        # Warm: the worker that paused the run still holds it (ES_AGENTS_WARM_RUNS).
        with _running(build_worker(settings, GateLoop())) as worker:
            for length, run_id in [(0, warm), *runs.items()]:
                approvals(worker, log, run_id, 1)  # loads it; it pauses, kept
                times = approvals(worker, log, run_id, repeats)
                if length == 0:
                    continue
                warm_results[length] = statistics.median(times)
                echo(
                    f"  {length:>7} events: resume in the worker that paused it "
                    f"{warm_results[length]:.2f} ms median of {repeats}"
                )
    finally:
        projector.stop()
        projector_thread.join(30)
        ports.close()
    shortest, longest = results[min(results)], results[max(results)]
    summary: dict[str, object] = {
        "store": settings.store,
        "resume_ms": {str(n): round(v, 3) for n, v in results.items()},
        "warm_resume_ms": {str(n): round(v, 3) for n, v in warm_results.items()},
        "k": settings.snapshot_every,
        "ratio_longest_to_shortest": round(longest / shortest, 2),
    }
    echo(json.dumps(summary))
    return summary
