"""``es-agents demo``: the log end to end on the real stack.

Appends one run's events (a model call that asks for a tool, the tool call, an approval
gate, the approval, the answer) with write-ahead acknowledgements, reads them back from
Kafka, folds them, and checks that what came back is what went in.
"""

from __future__ import annotations

import json
import statistics
import time
import uuid
from collections.abc import Callable

from es_agents.adapters.kafka import KafkaEventLog, ensure_topics
from es_agents.core import replay
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
            agent="examples.research:agent",
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
    )
    add(RunCompleted, step, output_json=json.dumps({"tickets": steps}))
    return events


def run_log_demo(steps: int, echo: Callable[[str], None]) -> bool:
    settings = load_settings().kafka
    ensure_topics(settings)
    log = KafkaEventLog(settings)
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    events = script(run_id, steps)
    try:
        acks_ms: list[float] = []
        for event in events:
            started = time.perf_counter()
            (position,) = log.append([event])
            acks_ms.append((time.perf_counter() - started) * 1000)
            echo(
                f"appended {event.wire_name:<22} seq {event.seq:>3} -> "
                f"{position.topic}[{position.partition}]@{position.offset}"
            )
        back = log.read_run(run_id)
    finally:
        log.close()
    state = replay(back)
    sizes = [len(log.codec.encode(e)) for e in events]
    checks = {
        "every event read back, in order": back == events,
        "seq contiguous from 0": [e.seq for e in back] == list(range(len(events))),
        "fold reaches completed": state.status == "completed",
        "tool calls folded": state.tool_calls == steps,
    }
    echo(
        f"run {run_id}: {len(back)} events, status {state.status}, "
        f"{state.prompt_tokens + state.completion_tokens} tokens"
    )
    echo(
        f"append ack p50 {statistics.median(acks_ms):.2f} ms, "
        f"mean event {statistics.mean(sizes):.0f} bytes"
    )
    for name, ok in checks.items():
        echo(f"[{'ok' if ok else 'FAIL'}] {name}")
    echo(f"audit it: es-agents replay {run_id}")
    return all(checks.values())
