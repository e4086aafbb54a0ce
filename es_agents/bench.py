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

import json
import statistics
import time
import uuid
from collections.abc import Callable

from confluent_kafka import Producer
from pydantic import BaseModel, JsonValue

from es_agents.adapters.kafka import KafkaEventLog, ensure_topics
from es_agents.agent import Agent, ToolAgent
from es_agents.codec import AvroCodec
from es_agents.core import RunState, replay
from es_agents.core.commands import StartRun
from es_agents.core.events import Event
from es_agents.core.step import CallTool, Finish, Step
from es_agents.models import ScriptedModel, call, reply
from es_agents.settings import Settings, load_settings
from es_agents.tools import ToolContext, tool
from es_agents.worker import Worker


class NoArgs(BaseModel):
    pass


@tool(NoArgs, side_effect=False)
def noop(args: NoArgs, ctx: ToolContext) -> JsonValue:
    """Does nothing: the step costs only the protocol."""
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
    )


class ToolLoop:
    """A planner with no model: ``steps`` no-op tool calls, then finish."""

    name = "bench"

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.model = None
        self.tools = {noop.name: noop}

    def plan(self, state: RunState) -> Step:
        if state.tool_calls >= self.steps:
            return Finish({"tool_calls": state.tool_calls})
        return CallTool(f"c{state.tool_calls}", "noop", {})

    def versions(self) -> dict[str, str | int]:
        return {"agent_version": "bench-tool-loop@1"}


def _run(settings: Settings, agent: Agent) -> tuple[list[Event], list[float], float]:
    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    log = KafkaEventLog(settings.kafka)
    try:
        log.send(StartRun(run_id=run_id, agent="bench"))
        worker = Worker(settings, agent, until_idle=True, idle_seconds=0.3)
        started = time.perf_counter()
        worker.run()
        wall = time.perf_counter() - started
        events = log.read_run(run_id)
    finally:
        log.close()
    state = replay(events)
    if state.status != "completed":
        raise RuntimeError(f"bench run ended {state.status}: {state.error}")
    return events, list(worker.append_ms), wall


def bench_steps(steps: int, echo: Callable[[str], None]) -> dict[str, object]:
    base = load_settings()
    kafka = base.kafka.model_copy(
        update={"topic_prefix": f"bench-{uuid.uuid4().hex[:8]}", "partitions": 1}
    )
    settings = Settings(**{**base.model_dump(), "kafka": kafka})
    ensure_topics(kafka)
    codec = AvroCodec()

    # 1. The protocol alone: no-op tool steps, no model, no transcript.
    events, acks, _ = _run(settings, ToolLoop(steps))
    tool_elapsed = (events[-1].at - events[0].at).total_seconds() * 1000
    tool_per_step = tool_elapsed / steps
    ack_p50 = statistics.median(acks)

    # 2. A chat agent: model and tool steps alternate, transcript grows.
    chat, chat_acks, _ = _run(settings, chat_agent(steps))
    chat_steps = max(e.step for e in chat)
    chat_per_step = (chat[-1].at - chat[0].at).total_seconds() * 1000 / chat_steps
    sizes: dict[int, int] = {}
    for event in chat:
        size = len(codec.encode(event)) + len(event.run_id)  # value + key
        sizes[event.step] = sizes.get(event.step, 0) + size
    last = chat_steps - 1  # the final step also carries run_completed

    # 3. Bare confluent-kafka, same settings: two records per acknowledged flush.
    record = b"x" * int(statistics.mean(sizes.values()) / 2)
    producer = Producer(kafka.producer_config())
    producer.produce(kafka.events_topic, key="warm", value=record)
    producer.flush()
    raw_ms = []
    for _ in range(steps):
        started = time.perf_counter()
        producer.produce(kafka.events_topic, key="raw", value=record)
        producer.produce(kafka.events_topic, key="raw", value=record)
        producer.flush()
        raw_ms.append((time.perf_counter() - started) * 1000)
    raw_p50 = statistics.median(raw_ms)

    result: dict[str, object] = {
        "steps": steps,
        "tool_step_ms": round(tool_per_step, 3),
        "append_ack_ms_p50": round(ack_p50, 3),
        "raw_produce_flush_ms_p50": round(raw_p50, 3),
        "ack_ratio_framework_to_raw": round(ack_p50 / raw_p50, 2),
        "step_ratio_framework_to_raw": round(tool_per_step / raw_p50, 2),
        "chat_step_ms": round(chat_per_step, 3),
        "chat_append_ack_ms_p50": round(statistics.median(chat_acks), 3),
        "bytes_step_10": sizes.get(10),
        f"bytes_step_{last}": sizes.get(last),
        "durability": "acks=all, single broker, page cache (no fsync per message)",
    }
    echo(
        f"{steps} no-op tool steps (no model): {tool_per_step:.3f} ms per step, "
        f"append ack p50 {ack_p50:.3f} ms"
    )
    echo(
        f"bare confluent-kafka produce x2 + flush, same settings: {raw_p50:.3f} ms p50 "
        f"(ack ratio {result['ack_ratio_framework_to_raw']}, "
        f"step ratio {result['step_ratio_framework_to_raw']})"
    )
    echo(
        f"chat agent, {chat_steps} steps: {chat_per_step:.3f} ms per step "
        "(includes the scripted model serializing the growing transcript)"
    )
    echo(
        f"log bytes per step: step 10 = {sizes.get(10)}, "
        f"step {last} = {sizes.get(last)}"
    )
    echo(json.dumps(result))
    return result
