"""A support desk written with Pydantic AI, run durably by es-agents. Orders are
looked up freely; a refund waits for a person's approval (Pydantic AI's
``requires_approval``) and is made once whatever crashes: the refund carries the
call's idempotency key to the payments system.

    pip install 'es-agents[pydantic-ai]'
    export ES_AGENTS_MODEL_BASE_URL=http://127.0.0.1:11434/v1
    export ES_AGENTS_MODEL_NAME=llama3.1
    es-agents serve --agent examples.pydantic_ai_desk:agent
    RUN=$(es-agents start pai-desk --input '"Order 7 arrived broken, refund it."')
    es-agents status $RUN          # paused at the gate refund
    es-agents approve $RUN --by lead
"""

from __future__ import annotations

import os

from pydantic_ai import Agent, RunContext
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from es_agents.integrations.pydantic_ai import PydanticAIAgent, durable


def desk() -> Agent[None, str]:
    model = OpenAIChatModel(
        os.environ.get("ES_AGENTS_MODEL_NAME", "llama3.1"),
        provider=OpenAIProvider(
            base_url=os.environ.get(
                "ES_AGENTS_MODEL_BASE_URL", "http://127.0.0.1:11434/v1"
            ),
            api_key=os.environ.get("ES_AGENTS_MODEL_API_KEY", "unused"),
        ),
    )
    agent: Agent[None, str] = Agent(
        model,
        name="pai-desk",
        instructions="You are the support desk of a small shop. Be brief.",
    )

    @agent.tool_plain
    def lookup_order(order: int) -> dict[str, object]:
        """Look an order up: its status."""
        return {"order": order, "status": "delivered"}

    @agent.tool(requires_approval=True)
    def refund(ctx: RunContext[None], order: int) -> dict[str, object]:
        """Refund an order."""
        key = (ctx.metadata or {})["idempotency_key"]  # a retry refunds once
        return {"refunded": order, "payment_key": key}

    return agent


def agent() -> PydanticAIAgent:
    """Built when the worker loads it (es-agents worker --agent module:agent)."""
    return durable(desk(), read_only={"lookup_order"})
