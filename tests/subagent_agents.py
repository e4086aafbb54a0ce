"""A lead agent that hands two tasks to researchers (child runs), for worker
processes: ``tests.subagent_agents:lead`` and ``tests.subagent_agents:researcher``.
Model calls are logged to ``ES_AGENTS_MODEL_CALLS_LOG`` when set."""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path

from es_agents.agent import ToolAgent
from es_agents.core.events import ToolCall
from es_agents.models import Completion, ScriptedModel, reply
from es_agents.tools import subagent

_calls = os.environ.get("ES_AGENTS_MODEL_CALLS_LOG")
_log = Path(_calls) if _calls else None

FAN_OUT = Completion(
    content=None,
    tool_calls=tuple(
        ToolCall(call_id=f"c{i}", name="researcher", args_json=json.dumps({"task": t}))
        for i, t in enumerate(("prices", "reviews"))
    ),
)

lead = ToolAgent(
    name="lead",
    system_prompt="Split the work between researchers, then sum up.",
    model=ScriptedModel([FAN_OUT, reply("Summed up.")], calls_log=_log),
    tool_list=[subagent("researcher")],
    children_lookup=timedelta(seconds=2),  # looks its children up itself after
)

researcher = ToolAgent(
    name="researcher",
    system_prompt="Research the task.",
    model=ScriptedModel([reply("a finding")], calls_log=_log),
)
