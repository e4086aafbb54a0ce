"""A support desk written with the OpenAI Agents SDK, run durably by es-agents:
triage hands refunds off to billing; a refund waits for a person's approval
(``needs_approval``) and is made once whatever crashes (``ctx.tool_call_id`` is
the call's idempotency key).

    pip install 'es-agents[openai-agents]'
    export ES_AGENTS_MODEL_BASE_URL=http://127.0.0.1:11434/v1
    export ES_AGENTS_MODEL_NAME=llama3.1
    es-agents serve --agent examples.openai_agents_desk:agent
    RUN=$(es-agents start triage --input '"Refund order 7, please."')
    es-agents approve $RUN --by lead
"""

from __future__ import annotations

import os
from typing import Any

from agents import Agent, function_tool
from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
from agents.tool_context import ToolContext
from openai import AsyncOpenAI

from es_agents.integrations.openai_agents import OpenAIAgentsAgent, durable


@function_tool
def lookup_order(order: int) -> dict[str, object]:
    """Look an order up: its status."""
    return {"order": order, "status": "delivered"}


@function_tool(needs_approval=True)
def refund(ctx: ToolContext[Any], order: int) -> dict[str, object]:
    """Refund an order."""
    return {"refunded": order, "payment_key": ctx.tool_call_id}


def triage() -> Agent[Any]:
    model = OpenAIChatCompletionsModel(
        os.environ.get("ES_AGENTS_MODEL_NAME", "llama3.1"),
        openai_client=AsyncOpenAI(
            base_url=os.environ.get(
                "ES_AGENTS_MODEL_BASE_URL", "http://127.0.0.1:11434/v1"
            ),
            api_key=os.environ.get("ES_AGENTS_MODEL_API_KEY", "unused"),
        ),
    )
    billing = Agent(
        name="billing", instructions="You make refunds.", tools=[refund], model=model
    )
    return Agent(
        name="triage",
        instructions="You answer about orders; billing makes refunds.",
        tools=[lookup_order],
        handoffs=[billing],
        model=model,
    )


def agent() -> OpenAIAgentsAgent:
    """Built when the worker loads it (es-agents worker --agent module:agent)."""
    return durable(triage(), read_only={"lookup_order"})
