"""An OpenAI Agents SDK agent made durable, for the tests: a triage agent that
looks orders up and hands off to billing, which emails and refunds (the refund
``needs_approval``). Their model is the SDK's Chat Completions model, pointed at
``ES_AGENTS_TEST_WIRE_URL`` (tests/wire_servers.py). Every effect is appended to
the file ``ES_TEST_EFFECTS`` names, so a test counts them across processes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from agents import Agent, function_tool
from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
from agents.tool_context import ToolContext
from openai import AsyncOpenAI

from es_agents.integrations.openai_agents import OpenAIAgentsAgent, durable
from es_agents.models import Completion, call, reply

SCRIPT: list[Completion] = [
    call("lookup_order", "c1", order=7),
    call("transfer_to_billing", "c2"),
    call("send_email", "c3", to="ann@example.com", body="Order 7 arrived."),
    call("refund", "c4", order=7),
    reply("Done: refunded."),
]

EFFECTS: list[dict[str, Any]] = []


def _effect(tool: str, ctx: ToolContext[Any], **args: Any) -> str:
    line = {"tool": tool, "key": ctx.tool_call_id, "args": args}
    path = os.environ.get("ES_TEST_EFFECTS")
    if path:
        with Path(path).open("a") as out:
            out.write(json.dumps(line) + "\n")
    EFFECTS.append(line)
    return ctx.tool_call_id


@function_tool
def lookup_order(order: int) -> dict[str, Any]:
    """Look an order up: its status."""
    return {"order": order, "status": "delivered"}


@function_tool
def send_email(ctx: ToolContext[Any], to: str, body: str) -> dict[str, Any]:
    """Send an email."""
    return {"sent": to, "key": _effect("send_email", ctx, to=to)}


@function_tool(needs_approval=True)
async def refund(ctx: ToolContext[Any], order: int) -> dict[str, Any]:
    """Refund an order."""
    return {"refunded": order, "key": _effect("refund", ctx, order=order)}


def triage_agent(url: str | None = None) -> Agent[Any]:
    base = url or os.environ.get("ES_AGENTS_TEST_WIRE_URL", "http://127.0.0.1:9/v1")
    model = OpenAIChatCompletionsModel(
        "desk-model", openai_client=AsyncOpenAI(base_url=base, api_key="test")
    )
    billing = Agent(
        name="billing",
        instructions="You handle refunds and emails.",
        tools=[send_email, refund],
        model=model,
    )
    return Agent(
        name="triage",
        instructions="You route customers: billing handles refunds.",
        tools=[lookup_order],
        handoffs=[billing],
        model=model,
    )


def triage(url: str | None = None) -> OpenAIAgentsAgent:
    return durable(triage_agent(url), read_only={"lookup_order"})
