"""A run's conversation as a person reads it, from its events: the input, what the
model answered (text and tool calls), what each tool returned, the decisions taken
and what was given to the run. Values are shown as recorded (already revealed for
a reader with the keys, tokens otherwise)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from es_agents.core.events import (
    Event,
    MessageReceived,
    ModelResponded,
    Resumed,
    RunStarted,
    ToolReturned,
)


@dataclass(frozen=True)
class Turn:
    who: str  # "input", "user", "model", "tool", "decision"
    text: str
    step: int


def conversation(events: Sequence[Event]) -> list[Turn]:
    tools: dict[str, str] = {}
    turns: list[Turn] = []
    for e in events:
        if isinstance(e, RunStarted):
            turns.append(Turn("input", _pretty(e.input_json), e.step))
        elif isinstance(e, ModelResponded):
            if e.content:
                turns.append(Turn("model", e.content, e.step))
            for call in e.tool_calls:
                tools[call.call_id] = call.name
                text = f"calls {call.name}({_pretty(call.args_json)})"
                turns.append(Turn("model", text, e.step))
        elif isinstance(e, ToolReturned):
            name = tools.get(e.call_id, "tool")
            if e.error is not None:
                text = f"{name} failed: {e.error}"
            else:
                text = f"{name} returned {_pretty(e.result_json or 'null')}"
            turns.append(Turn("tool", text, e.step))
        elif isinstance(e, MessageReceived):
            turns.append(Turn("user", f"{e.by}: {e.text}", e.step))
        elif isinstance(e, Resumed) and (e.by or e.input_json):
            text = e.reason + (f" by {e.by}" if e.by else "")
            if e.input_json:
                text += f": {_pretty(e.input_json)}"
            turns.append(Turn("decision", text, e.step))
    return turns


def _pretty(raw: str) -> str:
    try:
        return json.dumps(json.loads(raw), ensure_ascii=False)
    except ValueError:
        return raw
