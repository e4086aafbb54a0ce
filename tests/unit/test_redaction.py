"""Secret fields on the in-memory stack: a password in a tool's arguments and a token
in a tool's result never appear in plain text in the log, the state, the timeline or
the worker's log lines, and the tools still receive the real values -- the model
hands the token from one tool to the next without seeing it."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from pydantic import BaseModel, JsonValue, SecretStr

from es_agents.agent import ToolAgent
from es_agents.core.step import Message
from es_agents.errors import TerminalToolError
from es_agents.models import Completion, ScriptedModel, call, reply
from es_agents.redaction import SECRET, secret_fields
from es_agents.replay import timeline
from es_agents.testing import AgentHarness
from es_agents.tools import ToolContext, tool

PASSWORD = "hunter2-correct-horse"
TOKEN = "tok-9f8e7d6c5b4a"
RECEIVED: list[tuple[str, str]] = []


class Login(BaseModel):
    user: str
    password: SecretStr


class Session(BaseModel):
    token: SecretStr


class UseArgs(BaseModel):
    token: SecretStr
    what: str


@tool(Login)
def login(args: Login, ctx: ToolContext) -> JsonValue:
    """Logs in; returns a session token (secret)."""
    RECEIVED.append(("login", args.password.get_secret_value()))
    return Session(token=SecretStr(TOKEN))  # type: ignore[return-value]


@tool(UseArgs)
def use(args: UseArgs, ctx: ToolContext) -> JsonValue:
    """Uses the session."""
    RECEIVED.append(("use", args.token.get_secret_value()))
    return {"done": args.what}


def _hand_over(messages: Sequence[Message]) -> Completion:
    """The model passes on the token it was shown (what the transcript holds)."""
    shown = json.loads(str(messages[-1]["content"]))["token"]
    assert str(shown).startswith(SECRET)  # the model never sees the real one
    return call("use", "u1", token=shown, what="report")


def _agent() -> ToolAgent:
    return ToolAgent(
        name="operator",
        system_prompt="Log in, then use the session.",
        model=ScriptedModel(
            [
                call("login", "l1", user="ann", password=PASSWORD),
                _hand_over,
                reply("ok"),
            ]
        ),
        tool_list=[login, use],
    )


def test_secrets_stay_sealed_and_tools_get_the_real_values(
    es_harness: Callable[[Any], AgentHarness], caplog: pytest.LogCaptureFixture
) -> None:
    RECEIVED.clear()
    h = es_harness(_agent())
    run_id = h.start()
    with caplog.at_level(logging.DEBUG):
        h.run()
    assert RECEIVED == [("login", PASSWORD), ("use", TOKEN)]
    events = h.events(run_id)
    state = h.state(run_id)
    assert state.status == "completed"
    written = b"".join(h.ports.log.encode(e) for e in events)
    shown = json.dumps(timeline(events, {}))
    for secret in (PASSWORD, TOKEN):
        assert secret.encode() not in written
        assert secret not in repr(state)
        assert secret not in shown
        assert secret not in caplog.text
    assert written.count(SECRET.encode()) >= 2


def test_secret_fields_and_errors_that_do_not_repeat_values() -> None:
    assert secret_fields(Login) == {"password"}
    assert secret_fields(UseArgs) == {"token"}

    class Maybe(BaseModel):
        key: SecretStr | None = None
        name: str = ""

    assert secret_fields(Maybe) == {"key"}
    with pytest.raises(TerminalToolError) as refused:
        login.parse({"password": PASSWORD})  # no user: the error names no value
    assert "user: Field required" in str(refused.value)
    assert PASSWORD not in str(refused.value)


class EchoArgs(BaseModel):
    text: str


@tool(EchoArgs)
def echo(args: EchoArgs, ctx: ToolContext) -> JsonValue:
    """Says back what it was given (a field not declared secret)."""
    RECEIVED.append(("echo", args.text))
    return {"said": args.text}


def test_a_token_opens_only_in_a_field_declared_secret(
    es_harness: Callable[[Any], AgentHarness],
) -> None:
    """Before: a token was opened wherever it appeared in a tool's arguments, so a
    model that handed the session token to a tool that echoes it put the plain
    token in the log, the transcript and its own next prompt."""

    def leak(messages: Sequence[Message]) -> Completion:
        shown = json.loads(str(messages[-1]["content"]))["token"]
        return call("echo", "e1", text=shown)

    agent = ToolAgent(
        name="leaky",
        system_prompt="Log in, then echo the session.",
        model=ScriptedModel(
            [call("login", "l1", user="ann", password=PASSWORD), leak, reply("ok")]
        ),
        tool_list=[login, echo],
    )
    RECEIVED.clear()
    h = es_harness(agent)
    run_id = h.start()
    h.run()
    assert h.state(run_id).status == "completed"
    said = dict(RECEIVED)["echo"]
    assert said.startswith(SECRET)  # the echoing tool got the token, not the secret
    written = b"".join(h.ports.log.encode(e) for e in h.events(run_id))
    assert TOKEN.encode() not in written
    assert TOKEN not in repr(h.state(run_id))
