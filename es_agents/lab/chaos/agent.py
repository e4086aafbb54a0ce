"""The chaos agent: a gate, a charge, an email, a timer, an answer.

Per run: the model asks to ``charge`` (gated: a person approves; the downstream
dedupes by ``Idempotency-Key`` and answers lookups), then to ``send_email`` (the
downstream knows nothing of keys: the dedupe table guards it), then the run sleeps
until ``started_at + input.sleep_seconds`` (a timer row), and the model answers. Both
tools go to the effects service of ``es_agents.lab.chaos.effects`` at
``ES_AGENTS_CHAOS_EFFECTS_URL``, which counts every effect per key. Both send the
worker's fencing token; a refusal (409) raises ``FencedError``.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel, JsonValue

from es_agents.agent import ToolAgent
from es_agents.core.state import RunState
from es_agents.core.step import Fail, Interrupt, Step
from es_agents.errors import FencedError, RetryableToolError
from es_agents.models import ModelClient, ScriptedModel, call, reply
from es_agents.tools import Lookup, Tool, ToolContext, tool

NAME = "chaos"


def _url(path: str) -> str:
    base = os.environ.get("ES_AGENTS_CHAOS_EFFECTS_URL", "http://127.0.0.1:18090")
    return base.rstrip("/") + path


def _request(request: urllib.request.Request | str) -> JsonValue:
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
            body: JsonValue = json.loads(response.read())
            return body
    except urllib.error.HTTPError as e:
        if e.code == 409:  # the downstream saw a newer owner of the partition
            raise FencedError(f"effects service: {e.read().decode()}") from e
        raise
    except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
        raise RetryableToolError(f"effects service: {e}") from e


class ChargeArgs(BaseModel):
    cents: int


class EmailArgs(BaseModel):
    to: str
    body: str


def lookup_charge(key: str) -> Lookup:
    try:
        return Lookup.done(_request(_url(f"/charges?key={urllib.parse.quote(key)}")))
    except urllib.error.HTTPError as e:
        return Lookup.absent() if e.code == 404 else Lookup.unknown()
    except RetryableToolError:
        return Lookup.unknown()


@tool(
    ChargeArgs,
    honors_idempotency_key=True,
    lookup=lookup_charge,
    requires_approval=True,
)
def charge(args: ChargeArgs, ctx: ToolContext) -> JsonValue:
    """Charge the customer; the downstream dedupes by Idempotency-Key."""
    return _request(
        urllib.request.Request(  # noqa: S310 - the local effects service
            _url("/charges"),
            data=json.dumps({"cents": args.cents}).encode(),
            headers={
                "Content-Type": "application/json",
                "Idempotency-Key": ctx.idempotency_key,
                "X-Fencing-Token": ctx.fencing_token,
            },
            method="POST",
        )
    )


@tool(EmailArgs)
def send_email(args: EmailArgs, ctx: ToolContext) -> JsonValue:
    """Send an email. The downstream does not dedupe: every POST is one email."""
    return _request(
        urllib.request.Request(  # noqa: S310 - the local effects service
            _url("/emails"),
            data=json.dumps({"to": args.to, "key": ctx.idempotency_key}).encode(),
            headers={
                "Content-Type": "application/json",
                "X-Fencing-Token": ctx.fencing_token,
            },
            method="POST",
        )
    )


SCRIPT = [
    call("charge", "c1", cents=1299),
    call("send_email", "c2", to="customer@example.com", body="receipt"),
    reply("charged, receipt sent, waited for the timer"),
]


class ChaosAgent:
    """The tool-calling agent above, plus one sleep after the email."""

    name = NAME

    def __init__(self, calls_log: Path | None = None) -> None:
        self._inner = ToolAgent(
            name=NAME,
            system_prompt="Charge the order, email a receipt, wait, then answer.",
            model=ScriptedModel(
                SCRIPT, model_id="scripted-chaos", calls_log=calls_log, delay=0.01
            ),
            tool_list=[charge, send_email],
        )

    @property
    def tools(self) -> Mapping[str, Tool[Any]]:
        return self._inner.tools

    @property
    def model(self) -> ModelClient | None:
        return self._inner.model

    def versions(self) -> dict[str, str | int]:
        return self._inner.versions()

    def plan(self, state: RunState) -> Step:
        woke = state.last_resume is not None and state.last_resume.reason == "timer"
        if state.tool_calls >= 2 and not woke and not state.open_tool_calls:
            seconds = float(json.loads(state.input_json).get("sleep_seconds", 1))
            started = state.started_at or state.updated_at
            if started is None:
                return Fail("no start time to sleep from")
            return Interrupt("sleeping", wake_at=started + timedelta(seconds=seconds))
        return self._inner.plan(state)


_calls = os.environ.get("ES_AGENTS_MODEL_CALLS_LOG")
agent = ChaosAgent(Path(_calls) if _calls else None)
