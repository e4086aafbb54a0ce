"""A support desk as a thread: the customer writes, the model answers, and the
conversation goes on in one run until someone ends it. Refunds need a person's
approval; each refund is made once, whatever crashes (the refunds table is keyed by
the call's idempotency key).

    export ES_AGENTS_MODEL_PROVIDER=openai ES_AGENTS_MODEL_NAME=llama3.1
    export ES_AGENTS_MODEL_BASE_URL=http://127.0.0.1:11434/v1
    es-agents serve --agent examples.support_desk:agent

    RUN=$(es-agents start support-desk --input '"Hi, my order 7 arrived broken."')
    es-agents show $RUN                      # the model's first answer
    es-agents say $RUN "Can I get a refund?" # prints the answer; a refund waits...
    es-agents approve $RUN --by lead --args '{"order": 7, "amount": 10}'  # edited
    es-agents say $RUN "And order 8?"        # another refund...
    es-agents reject $RUN --by lead --reason "order 8 was refunded last week"
    es-agents show $RUN --follow             # ...the model answers the rejection
    es-agents say $RUN --end                 # the thread ends with its last answer
"""

from __future__ import annotations

import os

import psycopg
from pydantic import BaseModel, Field, JsonValue

from es_agents.agent import ToolAgent
from es_agents.app import build_model
from es_agents.core.budget import Budget
from es_agents.tools import Lookup, ToolContext, tool

PROMPT = (
    "You are the support desk of a small shop. Be brief. When a customer asks for a "
    "refund of an order, call refund with the order number and the amount."
)


class RefundArgs(BaseModel):
    order: int = Field(description="The order number")
    amount: float = Field(description="The amount to refund, in euros", gt=0)


def _db() -> psycopg.Connection[tuple[object, ...]]:
    conn = psycopg.connect(os.environ["ES_AGENTS_DATABASE_URL"], autocommit=True)
    conn.execute(
        "CREATE TABLE IF NOT EXISTS desk_refunds (idempotency_key text PRIMARY KEY, "
        "order_id bigint NOT NULL, amount numeric NOT NULL, "
        "at timestamptz NOT NULL DEFAULT now())"
    )
    return conn


def lookup_refund(key: str) -> Lookup:
    """Whether the refund of this call was made (reconciliation after a crash)."""
    with _db() as conn:
        row = conn.execute(
            "SELECT order_id FROM desk_refunds WHERE idempotency_key = %s", (key,)
        ).fetchone()
    return Lookup.done({"refunded": int(str(row[0]))}) if row else Lookup.absent()


@tool(
    RefundArgs,
    requires_approval=True,
    honors_idempotency_key=True,
    lookup=lookup_refund,
    on_reject="tell_model",  # a rejected refund: the model hears why and answers
)
def refund(args: RefundArgs, ctx: ToolContext) -> JsonValue:
    """Refund an order (needs a person's approval)."""
    with _db() as conn:
        conn.execute(
            "INSERT INTO desk_refunds (idempotency_key, order_id, amount) "
            "VALUES (%s, %s, %s) ON CONFLICT (idempotency_key) DO NOTHING",
            (ctx.idempotency_key, args.order, args.amount),
        )
    return {"refunded": args.order, "amount": args.amount}


def agent() -> ToolAgent:
    """Built when the worker loads it, so the model settings are read then."""
    return ToolAgent(
        name="support-desk",
        system_prompt=PROMPT,
        model=build_model(),
        tool_list=[refund],
        conversational=True,
        budget=Budget(max_turns=50),
    )
