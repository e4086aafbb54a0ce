"""The step protocol's crash points, in one process on the memory store.

The same points as the SIGKILL tests against Kafka and Postgres: a probe stops the
worker at the point (an exception no handler catches, so nothing after it runs), a
fresh worker resumes the run, and the run ends as a crash-free one does, with each
effect once and no recorded completion asked for again.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter

import pytest
from pydantic import BaseModel, JsonValue

from es_agents.agent import ToolAgent
from es_agents.app import build_ports, build_worker
from es_agents.core.commands import ProvideInput, StartRun
from es_agents.core.events import Event, ModelCallRequested, RunFailed, ToolReturned
from es_agents.core.fold import replay
from es_agents.core.state import RunState
from es_agents.errors import Unavailable
from es_agents.models import ScriptedModel, call, reply
from es_agents.ports import Ports
from es_agents.settings import KafkaSettings, Settings
from es_agents.testing import CrashAt
from es_agents.testing import Crashed as Crash
from es_agents.tools import Lookup, Tool, ToolContext, tool


class World:
    """The downstreams: tickets honor keys and can be looked up; emails cannot."""

    def __init__(self) -> None:
        self.tickets: dict[str, int] = {}
        self.emails: list[str] = []
        self.lock = threading.Lock()


class Query(BaseModel):
    query: str


class Ticket(BaseModel):
    title: str


class Email(BaseModel):
    to: str
    body: str


def crashy(world: World, model: ScriptedModel) -> ToolAgent:
    @tool(Query, side_effect=False)
    def search(args: Query, ctx: ToolContext) -> JsonValue:
        return {"hits": [args.query]}

    def create(args: Ticket, ctx: ToolContext) -> JsonValue:
        with world.lock:
            number = world.tickets.setdefault(ctx.idempotency_key, len(world.tickets))
        return {"id": number}

    def lookup(key: str) -> Lookup:
        with world.lock:
            found = world.tickets.get(key)
        return Lookup.absent() if found is None else Lookup.done({"id": found})

    @tool(Email)
    def send_email(args: Email, ctx: ToolContext) -> JsonValue:
        with world.lock:
            world.emails.append(ctx.idempotency_key)
        return {"sent": args.to}

    ticket: Tool[Ticket] = Tool(
        name="create_ticket",
        fn=create,
        args_model=Ticket,
        honors_idempotency_key=True,
        lookup=lookup,
    )
    return ToolAgent(
        name="crashy",
        system_prompt="Search, file a ticket, email ops, answer.",
        model=model,
        tool_list=[search, ticket, send_email],
    )


SCRIPT = [
    call("search", "c1", query="crash points"),
    call("create_ticket", "c2", title="Crash-safe ticket"),
    call("send_email", "c3", to="ops@example.com", body="ticket filed"),
    reply("done: one ticket, one email"),
]


def _settings() -> Settings:
    kafka = KafkaSettings(topic_prefix=f"crash-{uuid.uuid4().hex[:8]}", partitions=2)
    return Settings(kafka=kafka, store="memory", payloads="off")


def _work(settings: Settings, agent: ToolAgent, probe: CrashAt | None = None) -> None:
    worker = build_worker(settings, agent, until_idle=True, idle_seconds=0.05)
    if probe is not None:
        worker.ctx.probe = probe
    worker.run()


def _events(ports: Ports, run_id: str) -> list[Event]:
    return ports.log.read_run(run_id)


def _start(settings: Settings) -> tuple[Ports, str]:
    ports = build_ports(settings)
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    ports.log.send(StartRun(run_id=run_id, agent="crashy"))
    return ports, run_id


def _normalized(state: RunState) -> tuple[object, ...]:
    """What a crash may not change (steps may: a re-issued call takes one more)."""
    return (state.status, state.transcript, state.output_json, state.tool_calls)


@pytest.fixture(scope="module")
def baseline() -> RunState:
    settings = _settings()
    ports, run_id = _start(settings)
    _work(settings, crashy(World(), ScriptedModel(SCRIPT)))
    state = replay(_events(ports, run_id))
    assert state.status == "completed"
    return state


CRASH_POINTS = [
    "after_append:model_call_requested@2",  # intention durable, model not called
    "after_action:model@2",  # model answered, outcome not durable
    "before_append:model_responded@3",  # outcome and next intention not durable
    "after_append:model_responded@2",  # outcome durable, next action not started
    "after_append:tool_call_requested@2",  # ticket intention durable, not called
    "after_action:tool@2",  # ticket created downstream, outcome not durable
    "before_append:tool_returned@2",  # same, at the append itself
    "after_append:tool_returned@2",  # ticket outcome durable
    "after_append:tool_call_requested@3",  # email intention durable, no ledger row
    "after_action:tool@3",  # email sent, ledger done, outcome not durable
    "before_append:run_completed",  # the answer not durable
]


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_crash_at_each_protocol_point_then_resume(
    point: str, baseline: RunState
) -> None:
    settings = _settings()
    world, model = World(), ScriptedModel(SCRIPT)
    ports, run_id = _start(settings)
    with pytest.raises(Crash):
        _work(settings, crashy(world, model), CrashAt(point))
    assert replay(_events(ports, run_id)).status == "running"

    _work(settings, crashy(world, model))
    events = _events(ports, run_id)
    state = replay(events)
    assert _normalized(state) == _normalized(baseline)
    assert state.model_calls == baseline.model_calls
    assert len(set(world.tickets)) == 1  # one ticket per key
    assert len(world.emails) == 1
    requested = Counter(
        e.messages_hash for e in events if isinstance(e, ModelCallRequested)
    )
    for digest, issued in Counter(model.calls).items():
        assert issued <= requested[digest], (digest, issued, requested[digest])


class StoreGone(CrashAt):
    """The log's store out of reach at a point (a database restart on the
    Postgres store): the adapter raises ``Unavailable``."""

    def hit(self, point: str) -> None:
        if point == self.point:
            self.seen += 1
            if self.seen == self.nth:
                raise Unavailable(f"postgres: terminating connection at {point}")


def test_the_store_out_of_reach_at_a_model_request_is_not_the_models_failure(
    baseline: RunState,
) -> None:
    """A model step whose request cannot be appended: the worker stops (crash-only)
    and the run goes on under the next one -- it is not failed as
    ``model_unavailable``."""
    settings = _settings()
    world, model = World(), ScriptedModel(SCRIPT)
    ports, run_id = _start(settings)
    with pytest.raises(Unavailable, match="terminating connection"):
        _work(
            settings,
            crashy(world, model),
            StoreGone("before_append:model_call_requested@2"),
        )
    assert not any(isinstance(e, RunFailed) for e in _events(ports, run_id))
    _work(settings, crashy(world, model))
    state = replay(_events(ports, run_id))
    assert _normalized(state) == _normalized(baseline)


def test_crash_between_ledger_claim_and_call_pauses_for_a_person() -> None:
    settings = _settings()
    world, model = World(), ScriptedModel(SCRIPT)
    ports, run_id = _start(settings)
    with pytest.raises(Crash):
        _work(settings, crashy(world, model), CrashAt("after_claim:tool"))
    _work(settings, crashy(world, model))
    state = replay(_events(ports, run_id))
    assert state.status == "paused"
    assert state.waiting is not None
    assert state.waiting.reason == "uncertain_effect"
    assert world.emails == []  # never a silent second call
    ports.log.send(
        ProvideInput(run_id=run_id, by="ops", input_json='{"sent": "by hand"}')
    )
    _work(settings, crashy(world, model))
    events = _events(ports, run_id)
    assert replay(events).status == "completed"
    assert world.emails == []
    reconciled = [e for e in events if isinstance(e, ToolReturned) and e.reconciled]
    assert [e.result_json for e in reconciled] == ['{"sent": "by hand"}']
