"""Agents for the runtime tests, imported by worker processes (``tests.agents:...``).

``crashy``: search (no side effect), create_ticket (key honored downstream, lookup),
send_email (side effect, no key, no lookup: guarded by the dedupe table), then answer.
``sleepy``: sleeps until ``started_at + input.sleep_seconds``, then finishes.
``gated``: the research agent with its approval gate.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
from pydantic import BaseModel, JsonValue

from es_agents.agent import ToolAgent
from es_agents.core.retention import KEEP, Retention
from es_agents.core.state import RunState
from es_agents.core.step import Finish, Interrupt, PatchState, Step
from es_agents.core.transcript import Message
from es_agents.core.versions import StateMigration
from es_agents.lab import research
from es_agents.lab.bench import ToolLoop
from es_agents.models import (
    Completion,
    ModelClient,
    ScriptedModel,
    StreamingScriptedModel,
    call,
    reply,
)
from es_agents.tools import Tool, ToolContext, tool

_calls = os.environ.get("ES_AGENTS_MODEL_CALLS_LOG")
CALLS_LOG = Path(_calls) if _calls else None


class EmailArgs(BaseModel):
    to: str
    body: str


@tool(EmailArgs)
def send_email(args: EmailArgs, ctx: ToolContext) -> JsonValue:
    """Send an email: a downstream that knows nothing of idempotency keys."""
    url = os.environ["ES_AGENTS_DATABASE_URL"]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS test_emails (id bigserial PRIMARY KEY, "
            "run_key text NOT NULL, recipient text NOT NULL)"
        )
        conn.execute(
            "INSERT INTO test_emails (run_key, recipient) VALUES (%s, %s)",
            (ctx.idempotency_key, args.to),
        )
    return {"sent": args.to}


ungated_ticket: Tool[research.TicketArgs] = Tool(
    name="create_ticket",
    fn=research.create_ticket.fn,
    args_model=research.TicketArgs,
    honors_idempotency_key=True,
    lookup=research.lookup_ticket,
)

CRASHY_SCRIPT = [
    call("search", "c1", query="crash points"),
    call("create_ticket", "c2", title="Crash-safe ticket"),
    call("send_email", "c3", to="ops@example.com", body="ticket filed"),
    reply("done: one ticket, one email"),
]

crashy = ToolAgent(
    name="crashy",
    system_prompt="Search, file a ticket, email ops, answer.",
    model=ScriptedModel(CRASHY_SCRIPT, model_id="scripted-crashy", calls_log=CALLS_LOG),
    tool_list=[research.search, ungated_ticket, send_email],
)

gated = ToolAgent(
    name="research",
    system_prompt=research.agent.system_prompt,
    model=ScriptedModel(
        research.SCRIPT, model_id="scripted-research", calls_log=CALLS_LOG
    ),
    tool_list=[research.search, research.create_ticket],
)


class Sleepy:
    """A planner that sleeps once, then finishes."""

    name = "sleepy"
    tools: dict[str, Tool[BaseModel]] = {}  # noqa: RUF012 - read-only
    model: ModelClient | None = None

    def plan(self, state: RunState) -> Step:
        if state.last_resume is not None and state.last_resume.reason == "timer":
            return Finish({"woke_at_seq": state.last_resume.seq})
        seconds = float(json.loads(state.input_json).get("sleep_seconds", 1))
        assert state.started_at is not None
        return Interrupt(
            "sleeping", wake_at=state.started_at + timedelta(seconds=seconds)
        )

    def versions(self) -> dict[str, str | int]:
        return {"agent_version": "sleepy@1"}


sleepy = Sleepy()


# -- versions: the gated agent as later deployments would change it -----------------
class TicketArgsV2(BaseModel):
    title: str
    priority: int = 3


def _gated(
    version: str = "1",
    prompt: str | None = None,
    migrations: list[StateMigration] | None = None,
    ticket_args: type[BaseModel] = research.TicketArgs,
) -> ToolAgent:
    ticket: Tool[Any] = Tool(
        name="create_ticket",
        fn=research.create_ticket.fn,
        args_model=ticket_args,
        description=research.create_ticket.description,
        honors_idempotency_key=True,
        lookup=research.lookup_ticket,
        requires_approval=True,
    )
    return ToolAgent(
        name="research",
        system_prompt=prompt or research.agent.system_prompt,
        model=ScriptedModel(
            research.SCRIPT, model_id="scripted-research", calls_log=CALLS_LOG
        ),
        tool_list=[research.search, ticket],
        version=version,
        migrations=migrations or [],
    )


gated_v2 = _gated(version="2")
gated_v2_migrating = _gated(
    version="2",
    migrations=[
        StateMigration(
            "research@1",
            "research@2",
            "v2 keeps a review note in the run's state",
            patch=lambda state: {"review_note": f"migrated at seq {state.seq}"},
        )
    ],
)
gated_new_prompt = _gated(
    prompt="You are a careful research agent. Search, file, answer."
)
gated_new_tools = _gated(ticket_args=TicketArgsV2)


# -- bad inputs: what a model or a tool can get wrong --------------------------------
class NoArgs(BaseModel):
    pass


@tool(NoArgs, side_effect=False)
def explode(args: NoArgs, ctx: ToolContext) -> JsonValue:
    """Raises, as tools do."""
    raise ValueError("the tool broke")


@tool(NoArgs, side_effect=False)
def huge(args: NoArgs, ctx: ToolContext) -> JsonValue:
    """Returns more than one log record may hold."""
    return "x" * 2_000_000


PICKY_SCRIPT = [
    call("no_such_tool", "b1"),
    call("create_ticket", "b2", wrong_field=1),
    call("explode", "b3"),
    call("huge", "b4"),
    reply("survived"),
]

picky = ToolAgent(
    name="picky",
    system_prompt="Call tools that go wrong, then answer.",
    model=ScriptedModel(PICKY_SCRIPT, model_id="scripted-picky", calls_log=CALLS_LOG),
    tool_list=[ungated_ticket, explode, huge],
)


def _garbled(messages: object) -> Any:
    from es_agents.errors import RetryableToolError  # noqa: PLC0415

    raise RetryableToolError("unparsable model response: {'choices': []}")


garbled = ToolAgent(
    name="garbled",
    system_prompt="The model answers nonsense.",
    model=ScriptedModel([_garbled], model_id="scripted-garbled"),
)


# -- fencing: a model slow enough to pause a worker in the middle of a call ----------
slowpoke = ToolAgent(
    name="slowpoke",
    system_prompt="File a ticket, slowly.",
    model=ScriptedModel(
        [call("create_ticket", "s1", title="filed once"), reply("done")],
        model_id="scripted-slow",
        calls_log=CALLS_LOG,
        delay=2.0,
    ),
    tool_list=[ungated_ticket],
)


# -- fencing tokens: a downstream that refuses a worker older than the newest ---------
class FenceFile:
    """The downstream's memory, in ``ES_AGENTS_TEST_FENCE`` (JSON): the newest epoch
    per partition, and every call it accepted."""

    @staticmethod
    def path() -> Path:
        return Path(os.environ["ES_AGENTS_TEST_FENCE"])

    @classmethod
    def read(cls) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(cls.path().read_text())
        return data


@tool(EmailArgs)
def guarded_email(args: EmailArgs, ctx: ToolContext) -> JsonValue:
    """An email service that checks the caller's fencing token before sending."""
    from es_agents.errors import FencedError  # noqa: PLC0415

    data = FenceFile.read()
    newest = int(data["epochs"].get(str(ctx.partition), 0))
    if ctx.epoch < newest:
        raise FencedError(f"token {ctx.fencing_token} is older than epoch {newest}")
    data["epochs"][str(ctx.partition)] = ctx.epoch
    data["sent"].append({"key": ctx.idempotency_key, "token": ctx.fencing_token})
    FenceFile.path().write_text(json.dumps(data))
    return {"sent": args.to}


fenced_mailer = ToolAgent(
    name="fenced_mailer",
    system_prompt="Email ops once.",
    model=ScriptedModel(
        [call("guarded_email", "f1", to="ops@example.com", body="hi"), reply("done")],
        model_id="scripted-fenced",
    ),
    tool_list=[guarded_email],
)


# -- poison: one agent whose runs fail in every way a run can, beside healthy ones ----
@tool(NoArgs, timeout=1.0)
def hang(args: NoArgs, ctx: ToolContext) -> JsonValue:
    """A side-effecting call that never answers in time."""
    import time  # noqa: PLC0415

    time.sleep(30)
    return {"late": True}


class PoisonAgent(ToolAgent):
    """The model is a local OpenAI-compatible server (tests/model_server.py) that
    fails the runs asking it to; the planner fails the runs asking it to."""

    def plan(self, state: RunState) -> Step:
        poison = json.loads(state.input_json).get("poison")
        if poison == "planner":
            raise ValueError("the planner has a bug")
        if poison == "reducer":
            return PatchState(key="gate:x", value="not an object")  # fold refuses
        return super().plan(state)


def _poison_model() -> ModelClient:
    from es_agents.adapters.openai_model import OpenAIChatModel  # noqa: PLC0415

    url = os.environ.get("ES_AGENTS_TEST_MODEL_URL", "http://127.0.0.1:9/v1")
    return OpenAIChatModel(url, "test-model", timeout=10)


poison = PoisonAgent(
    name="poison",
    system_prompt="Answer ok.",
    model=_poison_model(),
    tool_list=[hang],
)


# -- quick: two steps and done, for rebalance and many-agents tests -------------------
@tool(NoArgs, side_effect=False)
def noop(args: NoArgs, ctx: ToolContext) -> JsonValue:
    """Does nothing."""
    return {"step": ctx.step}


def _quick(name: str) -> ToolAgent:
    return ToolAgent(
        name=name,
        system_prompt="Call noop, then answer.",
        model=ScriptedModel([call("noop", "c1"), reply("done")], model_id="scripted"),
        tool_list=[noop],
    )


quick = _quick("quick")
quick_other = _quick("quick-other")


# -- the research agent on a real model's wire (tests/wire_servers.py) ----------------
def _research_on(wire: str) -> ToolAgent:
    url = os.environ.get("ES_AGENTS_TEST_WIRE_URL", "http://127.0.0.1:9")
    model: ModelClient
    if wire == "openai":
        from es_agents.adapters.openai_model import OpenAIChatModel  # noqa: PLC0415

        model = OpenAIChatModel(url, "research-model", timeout=5)
    else:
        from es_agents.adapters.anthropic_model import AnthropicModel  # noqa: PLC0415

        model = AnthropicModel("research-model", base_url=url, timeout=5)
    return ToolAgent(
        name=f"research-{wire}",
        system_prompt=research.agent.system_prompt,
        model=model,
        tool_list=[research.search, research.create_ticket],
    )


def research_openai() -> ToolAgent:
    return _research_on("openai")


def research_anthropic() -> ToolAgent:
    return _research_on("anthropic")


# -- payloads of any size (the claim check) -------------------------------------------
class BlobArgs(BaseModel):
    mb: float


@tool(BlobArgs, side_effect=False)
def blob(args: BlobArgs, ctx: ToolContext) -> JsonValue:
    """A result of the given size in megabytes."""
    return "b" * int(args.mb * 1_000_000)


@tool(NoArgs, requires_approval=True, honors_idempotency_key=True)
def confirm(args: NoArgs, ctx: ToolContext) -> JsonValue:
    """Needs a person's approval."""
    return {"confirmed": ctx.idempotency_key}


def _bulky_answer(messages: object) -> Completion:
    return Completion(content="y" * 2_000_000)


bulky = ToolAgent(
    name="bulky",
    system_prompt="Fetch two blobs, answer at length.",
    model=ScriptedModel(
        [call("blob", "c1", mb=5), call("blob", "c2", mb=50), _bulky_answer],
        model_id="scripted-bulky",
        calls_log=CALLS_LOG,
    ),
    tool_list=[blob],
)

fragile = ToolAgent(
    name="fragile",
    system_prompt="Fetch a blob, then confirm.",
    model=ScriptedModel(
        [call("blob", "c1", mb=1), call("confirm", "c2"), reply("done")],
        model_id="scripted-fragile",
    ),
    tool_list=[blob, confirm],
)


# -- retention: a claim-checked tool result (with a small payload threshold), then
# done; the second kept one second after its end, then archived and purged ------------
def _archivist(name: str, retention: Retention = KEEP) -> ToolAgent:
    return ToolAgent(
        name=name,
        system_prompt="Fetch a blob, then answer.",
        model=ScriptedModel(
            [call("blob", "c1", mb=0.002), reply("archived")],
            model_id="scripted-archivist",
        ),
        tool_list=[blob],
        retention=retention,
    )


archivist = _archivist("archivist")
archivist_brief = _archivist("archivist-brief", Retention(timedelta(seconds=1)))


# -- a long transcript behind a gate: 35 no-op calls, then confirm (two chunks of
# stored messages); the last answer says what the model was sent as the input, and
# whether anything it was sent names MALLORY (the trust-boundary tests' marker) -----
def _what_it_saw(messages: Sequence[Message]) -> Completion:
    asked = next(str(m.get("content")) for m in messages if m.get("role") == "user")
    marked = " and MALLORY" if "MALLORY" in json.dumps(list(messages)) else ""
    return reply(f"saw {asked}{marked}")


longwinded = ToolAgent(
    name="longwinded",
    system_prompt="Call noop many times, then confirm, then say what you were asked.",
    model=ScriptedModel(
        [
            *(call("noop", f"n{i}") for i in range(35)),
            call("confirm", "c"),
            _what_it_saw,
        ],
        model_id="scripted-longwinded",
    ),
    tool_list=[noop, confirm],
)


# -- a steady load: many no-op tool steps per run (the cluster's broker-loss test) ---
steady = ToolLoop(1_000_000)  # until cancelled


# -- a thread (a conversational agent) -----------------------------------------------
desk = ToolAgent(
    name="desk",
    system_prompt="You are a support desk.",
    model=StreamingScriptedModel(  # each answer streams for about 1.5 s
        [reply("Hello! How can I help?"), reply("Your parcel ships today.")],
        model_id="scripted-desk",
        piece_chars=5,
        piece_gap=0.3,
    ),
    conversational=True,
)


# -- streaming on a real model's wire (tests/wire_servers.py) -------------------------
def _talker_on(wire: str) -> ToolAgent:
    agent = _research_on(wire)
    agent.name = f"talker-{wire}"
    return agent


def talker_openai() -> ToolAgent:
    return _talker_on("openai")


def talker_anthropic() -> ToolAgent:
    return _talker_on("anthropic")


# -- a gate with a deadline: nobody decides, the call is rejected at it ---------------
@tool(
    NoArgs,
    name="transfer",
    requires_approval=True,
    on_reject="tell_model",
    decide_within=timedelta(seconds=2),
)
def transfer(args: NoArgs, ctx: ToolContext) -> JsonValue:
    """Moves money (needs a decision within 2 s)."""
    return {"moved": True}


hasty = ToolAgent(
    name="hasty",
    system_prompt="Transfer, or say why not.",
    model=ScriptedModel(
        [call("transfer", "t1"), reply("No decision came; nothing was moved.")],
        model_id="scripted-hasty",
    ),
    tool_list=[transfer],
)


# -- a typed agent: its input and output are pydantic models ---------------------------
class TicketIn(BaseModel):
    title: str
    priority: int


class TriageOut(BaseModel):
    team: str
    urgent: bool


triage = ToolAgent(
    name="triage",
    system_prompt="Route the ticket.",
    model=ScriptedModel(
        [reply("ops?"), reply('{"team": "ops", "urgent": true}')],
        model_id="scripted-triage",
    ),
    input_model=TicketIn,
    output_model=TriageOut,
)


# -- stuck: a tool call that outlasts any wait, for a worker that must leave at once --
@tool(NoArgs, timeout=600)
def linger(args: NoArgs, ctx: ToolContext) -> JsonValue:
    """Says it started (``ES_AGENTS_TEST_MARKER``), then takes ten minutes."""
    import time  # noqa: PLC0415

    Path(os.environ["ES_AGENTS_TEST_MARKER"]).write_text(ctx.idempotency_key)
    time.sleep(600)
    return {"late": True}


stuck = ToolAgent(
    name="stuck",
    system_prompt="Call linger.",
    model=ScriptedModel([call("linger", "c1"), reply("done")], model_id="scripted"),
    tool_list=[linger],
)
