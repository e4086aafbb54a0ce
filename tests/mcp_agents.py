"""Agents whose tools an MCP server serves (tests.mcp_servers), for worker
processes: ``tests.mcp_agents:desk_http`` (the server at ``ES_TEST_MCP_URL``) and
``tests.mcp_agents:desk_stdio`` (the server started as a subprocess)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from mcp import StdioServerParameters

from es_agents.agent import ToolAgent
from es_agents.integrations.mcp import MCPTools
from es_agents.models import ScriptedModel, call, reply
from tests.test_support import ROOT

_calls = os.environ.get("ES_AGENTS_MODEL_CALLS_LOG")


def _desk(tools: MCPTools) -> ToolAgent:
    script = [
        call("lookup_order", "c1", order=7),
        call("send_email", "c2", to="ann@example.com", body="Order 7 arrived."),
        call("refund", "c3", order=7),
        reply("Done: refunded."),
    ]
    return ToolAgent(
        name="mcp-desk",
        system_prompt="You are a support desk.",
        model=ScriptedModel(script, calls_log=Path(_calls) if _calls else None),
        tool_list=tools.tools(),
    )


def desk_http() -> ToolAgent:
    return _desk(MCPTools(os.environ["ES_TEST_MCP_URL"], name="desk", gated={"refund"}))


def desk_stdio() -> ToolAgent:
    server = StdioServerParameters(
        command=sys.executable,
        args=["-m", "tests.mcp_servers", "stdio"],
        cwd=str(ROOT),
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    return _desk(MCPTools(server, name="desk", gated={"refund"}))
