"""``es-agents bench commands``: what start, approve, reject, provide-input, cancel
and status cost with 10 events on the topic and with 1,000,000.

On a scratch topic prefix and database, an in-process worker serves an agent whose
runs stop at once (at a gate, or asking for input) and a projector keeps the read side
current. Each command is timed through a warm ``Client`` (to its verdict: the worker
applied it) and as a CLI process; start and approve also to their acceptance
(``wait=0``: checked, recorded and durable in the log). Then the events topic is
filled with filler runs' events up to the large size, the projector catches up, and
the same is timed again.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable

from confluent_kafka import Producer

from es_agents.app import build_ports, build_projector, build_worker
from es_agents.client import Client, CommandResult
from es_agents.codec import AvroCodec
from es_agents.core import RunState
from es_agents.core.events import Event, RunStarted, StatePatched
from es_agents.core.step import Finish, Interrupt, Step
from es_agents.lab.bench import scratch_settings
from es_agents.settings import Settings

COMMANDS = ("start", "status", "approve", "reject", "provide-input", "cancel")


class Desk:
    """Stops at once: at the gate ``g``, or asking for input; done when resumed."""

    name = "bench-desk"
    tools: dict[str, object] = {}  # noqa: RUF012 - read-only
    model = None
    gates = frozenset({"g"})

    def plan(self, state: RunState) -> Step:
        if state.last_resume is not None:
            return Finish({"resumed": state.last_resume.reason})
        if json.loads(state.input_json).get("ask"):
            return Interrupt("awaiting_input")
        return Interrupt("awaiting_approval", gate="g")

    def versions(self) -> dict[str, str | int]:
        return {"agent_version": "bench-desk@1"}


def _fill(settings: Settings, events: int, echo: Callable[[str], None]) -> int:
    """Write filler runs of 1,000 events each (acknowledged, idempotent producer)."""
    codec = AvroCodec()
    producer = Producer(
        {
            **settings.kafka.producer_config(),
            "linger.ms": 20,
            "batch.num.messages": 10_000,
        }
    )
    topic = settings.kafka.events_topic
    written = 0
    started = time.perf_counter()
    while written < events:
        run_id = f"filler-{uuid.uuid4().hex[:12]}"
        length = min(1000, events - written)
        batch: list[Event] = [
            RunStarted(
                run_id=run_id,
                seq=0,
                step=0,
                agent="filler",
                input_json="{}",
                command_id=run_id,
            ),
            *(
                StatePatched(
                    run_id=run_id, seq=n, step=0, key=f"k{n % 8}", value_json=str(n)
                )
                for n in range(1, length)
            ),
        ]
        for event in batch:
            while True:
                try:
                    producer.produce(topic, codec.encode(event), run_id)
                    break
                except BufferError:
                    producer.poll(0.05)
        written += len(batch)
        producer.poll(0)
    if producer.flush(120) != 0:
        raise RuntimeError("filler events were not all acknowledged")
    echo(f"wrote {written} filler events in {time.perf_counter() - started:.1f} s")
    return written


def _cli(settings: Settings, *args: str) -> float:
    # As on a user's machine: bytecode cached (not compiled again on every run).
    env = {
        **{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
        "ES_AGENTS_TOPIC_PREFIX": settings.kafka.topic_prefix,
        "ES_AGENTS_PARTITIONS": str(settings.kafka.partitions),
        "ES_AGENTS_DATABASE_URL": settings.database_url.get_secret_value(),
    }
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "es_agents.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    took = (time.perf_counter() - t0) * 1000
    if done.returncode != 0:
        raise RuntimeError(f"es-agents {' '.join(args)}: {done.stderr[-500:]}")
    return took


def _measure(
    client: Client, settings: Settings, repeats: int, cli_repeats: int
) -> dict[str, dict[str, float]]:
    """Median ms per command through the warm client and as a CLI process."""

    def paused(ask: bool = False) -> str:
        result = client.start("bench-desk", json.dumps({"ask": ask}), wait=30)
        if result.status != "applied":
            raise RuntimeError(f"start: {result.status} {result.reason}")
        return result.run_id

    def check(result: CommandResult) -> None:
        if result.status != "applied":
            raise RuntimeError(f"{result.command.wire_name}: {result.reason}")

    def one(name: str, run: str) -> None:
        if name == "start":
            paused()
        elif name == "status":
            client.status(run)
        elif name == "approve":
            check(client.approve(run, by="bench"))
        elif name == "reject":
            check(client.reject(run, by="bench"))
        elif name == "provide-input":
            check(client.provide_input(run, "bench", "{}"))
        else:
            check(client.cancel(run, by="bench"))

    warm: dict[str, list[float]] = {c: [] for c in COMMANDS}
    accepted: dict[str, list[float]] = {"start": [], "approve": []}
    for _ in range(repeats):
        runs = {c: paused(ask=c == "provide-input") for c in COMMANDS}
        for name in COMMANDS:
            t0 = time.perf_counter()
            one(name, runs[name])
            warm[name].append((time.perf_counter() - t0) * 1000)
        # Accepted: checked, recorded and durable in the log (wait=0), not yet
        # applied by the worker.
        gated = paused()
        t0 = time.perf_counter()
        client.start("bench-desk", "{}", wait=0)
        accepted["start"].append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        client.approve(gated, by="bench", wait=0)
        accepted["approve"].append((time.perf_counter() - t0) * 1000)
    cli: dict[str, list[float]] = {c: [] for c in COMMANDS}
    for _ in range(cli_repeats):
        runs = {c: paused(ask=c == "provide-input") for c in COMMANDS}
        cli["start"].append(_cli(settings, "start", "bench-desk"))
        cli["status"].append(_cli(settings, "status", runs["status"]))
        for name in ("approve", "reject", "cancel"):
            cli[name].append(_cli(settings, name, runs[name], "--by", "bench"))
        cli["provide-input"].append(
            _cli(
                settings,
                "provide-input",
                runs["provide-input"],
                "--by",
                "bench",
                "--input",
                "{}",
            )
        )
    result = {
        name: {
            "client_ms": round(statistics.median(warm[name]), 2),
            "cli_ms": round(statistics.median(cli[name]), 1),
        }
        for name in COMMANDS
    }
    for name, times in accepted.items():
        result[name]["accepted_ms"] = round(statistics.median(times), 2)
    return result


def bench_commands(
    events: int, repeats: int, cli_repeats: int, echo: Callable[[str], None]
) -> dict[str, object]:
    with scratch_settings(partitions=6) as settings:
        return _bench(settings, events, repeats, cli_repeats, echo)


def _bench(
    settings: Settings,
    events: int,
    repeats: int,
    cli_repeats: int,
    echo: Callable[[str], None],
) -> dict[str, object]:
    worker = build_worker(settings, Desk())  # type: ignore[arg-type]
    projector = build_projector(settings, batch_size=5000)
    threads = [
        threading.Thread(target=worker.run, daemon=True),
        threading.Thread(target=projector.run, daemon=True),
    ]
    for thread in threads:
        thread.start()
    sizes: dict[str, dict[str, dict[str, float]]] = {}
    try:
        with Client(settings) as client:
            deadline = time.monotonic() + 60
            while client.start("bench-desk", wait=10).status != "applied":
                if time.monotonic() > deadline:
                    raise RuntimeError("the bench worker never answered")
            small = _topic_size(settings)
            sizes["small"] = _measure(client, settings, repeats, cli_repeats)
            echo(f"topic with {small} events: {json.dumps(sizes['small'])}")
            before = projector.projected
            written = _fill(settings, events, echo)
            t0 = time.perf_counter()
            while projector.projected < before + written:
                time.sleep(0.2)
            echo(f"projector caught up in {time.perf_counter() - t0:.1f} s")
            large = _topic_size(settings)
            sizes["large"] = _measure(client, settings, repeats, cli_repeats)
            echo(f"topic with {large} events: {json.dumps(sizes['large'])}")
    finally:
        worker.stop()
        projector.stop()
        for thread in threads:
            thread.join(60)
    result: dict[str, object] = {
        "events_small": small,
        "events_large": large,
        "ms": sizes,
        "ratio_large_to_small_client": {
            c: round(sizes["large"][c]["client_ms"] / sizes["small"][c]["client_ms"], 2)
            for c in COMMANDS
        },
    }
    echo(json.dumps(result))
    return result


def _topic_size(settings: Settings) -> int:
    ports = build_ports(settings)
    try:
        return sum(
            ports.log.end_offset(settings.kafka.events_topic, p)
            for p in range(settings.kafka.partitions)
        )
    finally:
        ports.close()
