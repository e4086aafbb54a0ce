"""Agents of the security tests, imported by worker processes
(``tests.secure_agents:...``): a four-eyes signed gate (``four_eyes``, and
``four_eyes_twice`` that pays two invoices), an agent whose payloads are encrypted
(``sealed``, and ``sealed_gate`` behind a gate) and one whose tools take and return
secrets (``secretive``)."""

from __future__ import annotations

import json
from collections.abc import Sequence

from pydantic import BaseModel, JsonValue, SecretStr

from es_agents.agent import ToolAgent
from es_agents.core.approvals import ApprovalPolicy
from es_agents.core.step import Message
from es_agents.models import Completion, ScriptedModel, call, reply
from es_agents.tools import ToolContext, tool


# -- signed approvals: a four-eyes gate ----------------------------------------------
class WireArgs(BaseModel):
    amount: int
    to: str


@tool(
    WireArgs,
    approval=ApprovalPolicy(
        approvers=frozenset({"alice"}),
        roles=frozenset({"finance"}),
        quorum=2,
        signed=True,
    ),
)
def wire(args: WireArgs, ctx: ToolContext) -> JsonValue:
    """Wires money: two approvers, signed decisions."""
    return {"wired": args.amount, "to": args.to, "key": ctx.idempotency_key}


four_eyes = ToolAgent(
    name="four-eyes",
    system_prompt="Pay the invoice.",
    model=ScriptedModel(
        [call("wire", "w1", amount=1200, to="ACME"), reply("paid")],
        model_id="scripted-payer",
    ),
    tool_list=[wire],
)


# -- encryption at rest: an agent whose payloads are written encrypted ---------------
class KeepArgs(BaseModel):
    note: str


@tool(KeepArgs)
def keep(args: KeepArgs, ctx: ToolContext) -> JsonValue:
    """Keeps a note (a side effect without a key: its result is in the dedupe table);
    the result is long enough to be claim-checked at a 1 KB threshold."""
    return {"kept": args.note, "copies": [args.note] * 60}


def _secret(messages: Sequence[Message]) -> str:
    return str(json.loads(str(messages[1]["content"]))["secret"])


sealed = ToolAgent(
    name="sealed",
    system_prompt="Keep the note.",
    model=ScriptedModel(
        [
            lambda messages: call("keep", "k1", note=_secret(messages)),
            lambda messages: reply(f"kept {_secret(messages)}"),
        ],
        model_id="scripted-keeper",
    ),
    tool_list=[keep],
    encrypted=True,
)


@tool(KeepArgs, requires_approval=True, on_reject="tell_model")
def file_note(args: KeepArgs, ctx: ToolContext) -> JsonValue:
    """Files a note once a person agreed (a rejection's reason goes to the model, in
    the call's error)."""
    return {"filed": args.note}


sealed_gate = ToolAgent(
    name="sealed-gate",
    system_prompt="File the note.",
    model=ScriptedModel(
        [call("file_note", "f1", note="a note"), reply("done")],
        model_id="scripted-filer",
    ),
    tool_list=[file_note],
    encrypted=True,
)


# -- secrets: a password in arguments, a token in a result ---------------------------
PASSWORD = "hunter2-correct-horse"
TOKEN = "tok-9f8e7d6c5b4a"


class LoginArgs(BaseModel):
    user: str
    password: SecretStr


class SessionArgs(BaseModel):
    token: SecretStr


@tool(LoginArgs, side_effect=False)
def sign_in(args: LoginArgs, ctx: ToolContext) -> JsonValue:
    """Signs in; the session token it returns is secret."""
    ok = args.password.get_secret_value() == PASSWORD
    return {"token": SecretStr(TOKEN) if ok else None}  # type: ignore[dict-item]


@tool(SessionArgs, side_effect=False)
def whoami(args: SessionArgs, ctx: ToolContext) -> JsonValue:
    """Says whether the token it received is the real one."""
    return {"token_ok": args.token.get_secret_value() == TOKEN}


def _pass_token(messages: Sequence[Message]) -> Completion:
    token = json.loads(str(messages[-1]["content"]))["token"]
    return call("whoami", "w1", token=token)


secretive = ToolAgent(
    name="secretive",
    system_prompt="Sign in, then check the session.",
    model=ScriptedModel(
        [
            call("sign_in", "s1", user="ann", password=PASSWORD),
            _pass_token,
            reply("ok"),
        ],
        model_id="scripted-secretive",
    ),
    tool_list=[sign_in, whoami],
)


four_eyes_twice = ToolAgent(
    name="four-eyes-twice",
    system_prompt="Pay two invoices.",
    model=ScriptedModel(
        [
            call("wire", "w1", amount=1200, to="ACME"),
            call("wire", "w2", amount=300, to="Initech"),
            reply("paid"),
        ],
        model_id="scripted-payer",
    ),
    tool_list=[wire],
)
