"""``es-agents demo``: the mission's research agent through a gate and a crash.

On the real stack: a run asks the ticketing service for a ticket behind an approval
gate; its worker process exits at the gate (the run is a row); an approval arrives as
a command; the next worker is SIGKILLed after the ticket was created and before
``tool_returned`` was appended; a fresh worker reconciles the call by its idempotency
key and the run completes with exactly one ticket. ``script`` builds a synthetic log
for tests and examples.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from es_agents.app import build_client_ports, ensure_topics
from es_agents.core import replay
from es_agents.core.commands import StartRun
from es_agents.core.events import (
    Event,
    Interrupted,
    ModelCallRequested,
    ModelResponded,
    Resumed,
    RunCompleted,
    RunStarted,
    ToolCall,
    ToolCallRequested,
    ToolReturned,
    Usage,
)
from es_agents.settings import load_settings


def script(run_id: str, steps: int) -> list[Event]:
    """A research agent's log: ``steps`` model+tool rounds, an approval, an answer."""
    events: list[Event] = [
        RunStarted(
            run_id=run_id,
            seq=0,
            step=0,
            agent="es_agents.lab.research:agent",
            input_json=json.dumps({"topic": "durable agents"}),
            command_id=str(uuid.uuid4()),
            agent_version="demo-1",
        )
    ]

    def add(event_type: type[Event], step: int, **fields: object) -> None:
        events.append(event_type(run_id=run_id, seq=len(events), step=step, **fields))

    step = 0
    for round_no in range(steps):
        step += 1
        add(
            ModelCallRequested,
            step,
            messages_hash=f"sha256:{round_no:064x}",
            message_count=2 + 2 * round_no,
            params_json='{"model":"scripted"}',
        )
        call = ToolCall(
            call_id=f"call-{round_no}",
            name="create_ticket",
            args_json=json.dumps({"title": f"finding {round_no}"}),
        )
        add(
            ModelResponded,
            step,
            tool_calls=(call,),
            finish_reason="tool_calls",
            usage=Usage(prompt_tokens=120 + round_no, completion_tokens=18),
            model_id="scripted",
        )
        step += 1
        add(
            ToolCallRequested,
            step,
            call_id=call.call_id,
            tool=call.name,
            args_json=call.args_json,
            idempotency_key=f"{run_id}:{step}",
        )
        add(
            ToolReturned,
            step,
            call_id=call.call_id,
            result_json=json.dumps({"ticket": f"T-{round_no}"}),
        )
    add(Interrupted, step, reason="awaiting_approval")
    add(Resumed, step, reason="approved", by="demo")
    step += 1
    add(
        ModelCallRequested,
        step,
        messages_hash="sha256:" + "f" * 64,
        message_count=2 + 2 * steps,
        params_json='{"model":"scripted"}',
    )
    add(
        ModelResponded,
        step,
        content="Filed the tickets.",
        usage=Usage(prompt_tokens=300, completion_tokens=9),
        model_id="scripted",
    )
    add(RunCompleted, step, output_json=json.dumps({"tickets": steps}))
    return events


AGENT = "es_agents.lab.research:agent"


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, **extra}


@contextmanager
def ticket_service(database_url: str, port: int = 18080) -> Iterator[str]:
    """The example ticketing service as a child process; yields its URL."""
    url = f"http://127.0.0.1:{port}"
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", port)) == 0:
            raise RuntimeError(f"port {port} is taken: stop what listens there")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "es_agents.lab.ticket_service",
            "--port",
            str(port),
            "--database-url",
            database_url,
        ],
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=1):  # noqa: S310
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    err = proc.stderr.read().decode() if proc.stderr else ""
                    raise RuntimeError(f"ticket service did not start: {err}") from None
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def ticket_stats(url: str, prefix: str) -> dict[str, int]:
    with urllib.request.urlopen(  # noqa: S310 - our own local service
        f"{url}/tickets/stats?prefix={prefix}",
        timeout=5,
    ) as response:
        stats: dict[str, int] = json.loads(response.read())
        return stats


def run_worker(
    env: dict[str, str],
    agent: str = AGENT,
    instance_id: str = "demo-worker",
    timeout: float = 120,
) -> subprocess.CompletedProcess[str]:
    """One worker process that exits once idle (or is killed at a crash point)."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "es_agents.cli",
            "worker",
            "--agent",
            agent,
            "--until-idle",
            *(["--instance-id", instance_id] if instance_id else []),
        ],
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "es_agents.cli", *args],
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def run_demo(echo: Callable[[str], None]) -> bool:
    settings = load_settings()
    ensure_topics(settings)
    work = Path(tempfile.mkdtemp(prefix="es-agents-demo-"))
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    calls_log = work / f"model-calls-{run_id}.jsonl"
    ports = build_client_ports(settings)
    log = ports.log
    try:
        port = int(os.environ.get("ES_AGENTS_DEMO_TICKETS_PORT", "18080"))
        with ticket_service(settings.database_url.get_secret_value(), port) as url:
            env = {
                "ES_AGENTS_MODEL_CALLS_LOG": str(calls_log),
                "ES_AGENTS_TICKETS_URL": url,
            }
            echo(f"ticketing service: {url} (tickets in Postgres, Idempotency-Key)")
            log.send(
                StartRun(
                    run_id=run_id,
                    agent="research",
                    input_json=json.dumps({"topic": "durable agents"}),
                )
            )
            echo(f"1. start_run {run_id}")

            first = run_worker(env)
            state = replay(log.read_run(run_id))
            waiting = state.waiting
            echo(
                f"2. worker exited with code {first.returncode}; the run is a row: "
                f"{state.status}, {waiting.reason if waiting else '-'} at gate "
                f"{waiting.gate if waiting else '-'}"
            )

            approved = cli(env, "approve", run_id, "--by", "alice")
            echo(
                f"3. es-agents approve {run_id} --by alice -> {approved.stdout.strip()}"
            )

            crashed = run_worker({**env, "ES_AGENTS_CRASH_AT": "after_action:tool"})
            state = replay(log.read_run(run_id))
            echo(
                f"4. worker SIGKILLed after the ticket call, before tool_returned: "
                f"exit {crashed.returncode}; dangling {type(state.pending).__name__}"
                f" key {getattr(state.pending, 'idempotency_key', '-')}"
            )

            last = run_worker(env)
            events = log.read_run(run_id)
            state = replay(events)
            echo(
                f"5. a fresh worker reconciled by key and finished: exit "
                f"{last.returncode}, run {state.status}"
            )
            stats = ticket_stats(url, run_id)
    finally:
        ports.close()

    echo(f"\ntimeline ({settings.store} store):")
    for event in events:
        echo(
            f"  {event.seq:>3} step {event.step:>2}  {event.wire_name:<21} "
            f"{_detail(event)}"
        )
    issued = [json.loads(line) for line in calls_log.read_text().splitlines()]
    hashes = [c["hash"] for c in issued]
    recorded = sum(isinstance(e, ModelResponded) for e in events)
    sizes = [len(log.encode(e)) for e in events]
    checks = {
        "first worker exited at the gate (code 0)": first.returncode == 0,
        "second worker was SIGKILLed at the crash point": crashed.returncode == -9,
        "approval applied once": approved.returncode == 0,
        f"tickets for the run: {stats['tickets']} (one per key)": stats["tickets"] == 1,
        "the dangling call was reconciled, not re-issued": state.reconciled_calls == 1,
        f"model calls issued {len(issued)} = recorded {recorded}": len(issued)
        == recorded,
        "no recorded completion re-issued": len(set(hashes)) == len(hashes),
        "run completed": state.status == "completed",
    }
    echo(
        f"\n{len(events)} events for {state.step} steps "
        f"({len(events) / max(state.step, 1):.1f} per step), "
        f"{sum(sizes) / max(state.step, 1):.0f} log bytes per step"
    )
    for name, ok in checks.items():
        echo(f"[{'ok' if ok else 'FAIL'}] {name}")
    echo(f"audit it: es-agents replay {run_id}")
    if not all(checks.values()):
        for proc in (first, crashed, last):
            echo(proc.stderr[-3000:])
    return all(checks.values())


def _detail(event: Event) -> str:  # noqa: PLR0911 - one line per event type
    if isinstance(event, ToolCallRequested):
        return f"{event.tool} key={event.idempotency_key}"
    if isinstance(event, ToolReturned):
        return ("reconciled " if event.reconciled else "") + (event.result_json or "")[
            :60
        ]
    if isinstance(event, ModelResponded):
        if event.tool_calls:
            return "asks for " + ", ".join(c.name for c in event.tool_calls)
        return (event.content or "")[:60]
    if isinstance(event, Interrupted):
        return f"{event.reason} {event.detail_json[:60]}"
    if isinstance(event, Resumed):
        return f"{event.reason} by {event.by}"
    return ""
