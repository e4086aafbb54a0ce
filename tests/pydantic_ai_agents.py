"""A Pydantic AI agent made durable, for the tests: a support desk with a
read-only lookup, an email (a side effect the dedupe table guards) and a refund
Pydantic AI marks ``requires_approval``. Its model is Pydantic AI's OpenAI model,
pointed at ``ES_AGENTS_TEST_WIRE_URL`` (tests/wire_servers.py). Every effect is
appended to the file ``ES_TEST_EFFECTS`` names (one JSON line each), so a test
counts effects across worker processes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic_ai import Agent, ModelRetry, RunContext
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from es_agents.integrations.pydantic_ai import PydanticAIAgent, durable
from es_agents.models import Completion, call, reply

SCRIPT: list[Completion] = [
    call("lookup_order", "c1", order=7),
    call("send_email", "c2", to="ann@example.com", body="Order 7 arrived."),
    call("refund", "c3", order=7),
    reply("Done: refunded."),
]

EFFECTS: list[dict[str, Any]] = []


def _effect(tool: str, ctx: RunContext[Any], **args: Any) -> str:
    key = str((ctx.metadata or {}).get("idempotency_key"))
    line = {"tool": tool, "key": key, "args": args}
    path = os.environ.get("ES_TEST_EFFECTS")
    if path:
        with Path(path).open("a") as out:
            out.write(json.dumps(line) + "\n")
    EFFECTS.append(line)
    return key


def desk_agent(url: str | None = None) -> Agent[None, str]:
    base = url or os.environ.get("ES_AGENTS_TEST_WIRE_URL", "http://127.0.0.1:9/v1")
    model = OpenAIChatModel(
        "desk-model", provider=OpenAIProvider(base_url=base, api_key="test")
    )
    desk: Agent[None, str] = Agent(
        model,
        name="pai-desk",
        system_prompt="You are a support desk.",
        instructions="Be brief.",
    )

    @desk.tool_plain
    def lookup_order(order: int) -> dict[str, Any]:
        """Look an order up: its status."""
        return {"order": order, "status": "delivered"}

    @desk.tool
    def send_email(ctx: RunContext[None], to: str, body: str) -> dict[str, Any]:
        """Send an email."""
        if "@" not in to:
            raise ModelRetry("that is no email address")
        return {"sent": to, "key": _effect("send_email", ctx, to=to)}

    @desk.tool(requires_approval=True)
    async def refund(ctx: RunContext[None], order: int) -> dict[str, Any]:
        """Refund an order."""
        return {"refunded": order, "key": _effect("refund", ctx, order=order)}

    return desk


def desk(url: str | None = None) -> PydanticAIAgent:
    return durable(desk_agent(url), read_only={"lookup_order"})
