"""``es-agents bench parallel``: one step whose model answer asks for N tool calls
of a fixed latency each, on the real stack (fenced by default).

The step counts from the model's answer to the next model request: the answer and
every call's intention appended together, the calls run concurrently, each outcome
made durable, and the planner's next request created. Measured for an ``async def``
tool (awaited on the worker's event loop) and for a plain function (on the call
pool's threads); the JSON line has both, with the serial time for comparison.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Callable

from pydantic import BaseModel, JsonValue

from es_agents.agent import ToolAgent
from es_agents.core.events import Event, ModelCallRequested, ModelResponded, ToolCall
from es_agents.core.step import canonical_json
from es_agents.lab.bench import _run, scratch_settings
from es_agents.models import Completion, ScriptedModel, reply
from es_agents.tools import Tool, ToolContext, tool


class Wait(BaseModel):
    n: int


def _agent(calls: int, seconds: float, plain: bool) -> ToolAgent:
    @tool(Wait, name="wait", side_effect=False)
    async def wait_async(args: Wait, ctx: ToolContext) -> JsonValue:
        await asyncio.sleep(seconds)
        return {"n": args.n}

    @tool(Wait, name="wait", side_effect=False)
    def wait_plain(args: Wait, ctx: ToolContext) -> JsonValue:
        time.sleep(seconds)
        return {"n": args.n}

    chosen: Tool[Wait] = wait_plain if plain else wait_async
    answer = Completion(
        content=None,
        tool_calls=tuple(
            ToolCall(call_id=f"c{i}", name="wait", args_json=canonical_json({"n": i}))
            for i in range(calls)
        ),
    )
    return ToolAgent(
        name="bench",
        system_prompt="Wait in parallel.",
        model=ScriptedModel([answer, reply("done")], model_id="scripted-bench"),
        tool_list=[chosen],
    )


def _step_ms(events: list[Event]) -> float:
    answered = next(e for e in events if isinstance(e, ModelResponded))
    asked = [e for e in events if isinstance(e, ModelCallRequested)][-1]
    return (asked.at - answered.at).total_seconds() * 1000


def bench_parallel(
    calls: int, latency_ms: float, repeats: int, echo: Callable[[str], None]
) -> dict[str, object]:
    seconds = latency_ms / 1000
    result: dict[str, object] = {"calls": calls, "tool_latency_ms": latency_ms}
    with scratch_settings(partitions=1) as settings:
        result["fencing"] = settings.fencing
        for kind, plain in (("async", False), ("plain", True)):
            times = []
            for _ in range(repeats):
                events, _, _ = _run(settings, _agent(calls, seconds, plain))
                times.append(_step_ms(events))
            median = statistics.median(times)
            result[f"{kind}_step_ms_p50"] = round(median, 1)
            echo(
                f"{calls} {kind} tool calls of {latency_ms:.0f} ms in one step "
                f"({settings.fencing} fencing): {median:.1f} ms p50 of {repeats} "
                f"(serially {calls * latency_ms:.0f} ms)"
            )
    result["serial_ms"] = calls * latency_ms
    echo(json.dumps(result))
    return result
