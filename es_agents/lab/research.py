"""The mission's research agent: it searches, files a ticket (behind an approval
gate) in the real ticketing service, and answers. The model is scripted, behind the
same interface as the HTTP adapter, since no model API is reachable here."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from pydantic import BaseModel, JsonValue

from es_agents.agent import ToolAgent
from es_agents.errors import RetryableToolError
from es_agents.models import ScriptedModel, call, reply
from es_agents.tools import Lookup, ToolContext, tool

TICKETS_URL = os.environ.get("ES_AGENTS_TICKETS_URL", "http://127.0.0.1:18080")


class SearchArgs(BaseModel):
    query: str


class TicketArgs(BaseModel):
    title: str


@tool(SearchArgs, side_effect=False)
def search(args: SearchArgs, ctx: ToolContext) -> JsonValue:
    """Search the notes (no side effects)."""
    return {
        "query": args.query,
        "hits": [
            "write-ahead logs make steps durable",
            "idempotency keys make effects happen once",
        ],
    }


def lookup_ticket(key: str) -> Lookup:
    """Ask the ticketing service whether a ticket exists for this key."""
    url = f"{TICKETS_URL}/tickets?idempotency_key={urllib.parse.quote(key)}"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310
            return Lookup.done(json.loads(response.read()))
    except urllib.error.HTTPError as e:
        return Lookup.absent() if e.code == 404 else Lookup.unknown()
    except (urllib.error.URLError, TimeoutError):
        return Lookup.unknown()


@tool(
    TicketArgs,
    honors_idempotency_key=True,
    lookup=lookup_ticket,
    requires_approval=True,
)
def create_ticket(args: TicketArgs, ctx: ToolContext) -> JsonValue:
    """Open a ticket; the idempotency key goes in the Idempotency-Key header."""
    request = urllib.request.Request(  # noqa: S310 - http(s) from settings
        f"{TICKETS_URL}/tickets",
        data=json.dumps({"title": args.title}).encode(),
        headers={
            "Content-Type": "application/json",
            "Idempotency-Key": ctx.idempotency_key,
        },
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
            ticket: JsonValue = json.loads(response.read())
            return ticket
    except (urllib.error.URLError, TimeoutError) as e:
        raise RetryableToolError(f"ticket service: {e}") from e


SCRIPT = [
    call("search", "call-1", query="durable execution for LLM agents"),
    call("create_ticket", "call-2", title="Adopt event-sourced agent runs"),
    reply(
        "Filed the ticket; durable runs need write-ahead steps and idempotency keys."
    ),
]

_log = os.environ.get("ES_AGENTS_MODEL_CALLS_LOG")
agent = ToolAgent(
    name="research",
    system_prompt="You are a research agent. Search, file a ticket, then answer.",
    model=ScriptedModel(
        SCRIPT, model_id="scripted-research", calls_log=Path(_log) if _log else None
    ),
    tool_list=[search, create_ticket],
)
