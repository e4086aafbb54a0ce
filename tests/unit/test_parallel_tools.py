"""A model answer with several tool calls: every intention in one append, the calls
concurrently (plain and ``async def`` tools), each with its own key and outcome; a
gated call waits for its decision without holding the others; a crash anywhere
among them resumes with each effect once. On the memory store, in one process."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections import Counter

import pytest
from pydantic import BaseModel, JsonValue

from es_agents.agent import ToolAgent
from es_agents.app import build_ports, build_worker
from es_agents.core.commands import Approve, ProvideInput, StartRun
from es_agents.core.events import (
    Event,
    Interrupted,
    ToolCall,
    ToolCallRequested,
    ToolReturned,
)
from es_agents.core.fold import replay
from es_agents.core.snapshot import from_snapshot, to_snapshot
from es_agents.core.step import canonical_json
from es_agents.models import Completion, ScriptedModel, reply
from es_agents.ports import Ports
from es_agents.settings import KafkaSettings, Settings
from es_agents.testing import CrashAt
from es_agents.testing import Crashed as Crash
from es_agents.tools import ToolContext, tool


class Note(BaseModel):
    text: str


class World:
    """What the tools did, by idempotency key; a barrier that only calls running
    at the same time can pass."""

    def __init__(self, together: int = 0) -> None:
        self.done: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.barrier = threading.Barrier(together) if together else None

    def meet(self) -> None:
        if self.barrier is not None:
            self.barrier.wait(timeout=10)  # BrokenBarrierError if not concurrent

    def record(self, what: str, ctx: ToolContext) -> JsonValue:
        with self.lock:
            self.done[f"{what}:{ctx.idempotency_key}"] += 1
        return {"did": what}


def agent(world: World, model: ScriptedModel, gated: bool = False) -> ToolAgent:
    @tool(Note, side_effect=False)
    def look(args: Note, ctx: ToolContext) -> JsonValue:
        world.meet()
        return world.record("look", ctx)

    @tool(Note, side_effect=False)
    async def fetch(args: Note, ctx: ToolContext) -> JsonValue:
        await asyncio.to_thread(world.meet)
        return world.record("fetch", ctx)

    @tool(Note)  # side effects, no key honored downstream: the effect ledger
    def send(args: Note, ctx: ToolContext) -> JsonValue:
        world.meet()
        return world.record("send", ctx)

    @tool(Note, requires_approval=True)
    def wire(args: Note, ctx: ToolContext) -> JsonValue:
        return world.record("wire", ctx)

    return ToolAgent(
        name="parallel",
        system_prompt="Do three things at once.",
        model=model,
        tool_list=[look, fetch, send, *([wire] if gated else [])],
    )


def answer(*names: str) -> Completion:
    return Completion(
        content=None,
        tool_calls=tuple(
            ToolCall(
                call_id=f"c{i}", name=name, args_json=canonical_json({"text": name})
            )
            for i, name in enumerate(names)
        ),
    )


def _settings() -> Settings:
    kafka = KafkaSettings(topic_prefix=f"par-{uuid.uuid4().hex[:8]}", partitions=2)
    return Settings(kafka=kafka, store="memory", payloads="off")


def _start(settings: Settings) -> tuple[Ports, str]:
    ports = build_ports(settings)
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    ports.log.send(StartRun(run_id=run_id, agent="parallel"))
    return ports, run_id


def _work(settings: Settings, a: ToolAgent, probe: CrashAt | None = None) -> None:
    worker = build_worker(settings, a, until_idle=True, idle_seconds=0.05)
    if probe is not None:
        worker.ctx.probe = probe
    worker.run()


def _types(events: list[Event]) -> list[str]:
    return [e.wire_name for e in events]


def test_the_calls_of_one_answer_run_concurrently_each_with_its_key() -> None:
    settings = _settings()
    world = World(together=3)  # passes only if the three calls overlap
    model = ScriptedModel([answer("look", "fetch", "send"), reply("done")])
    ports, run_id = _start(settings)
    _work(settings, agent(world, model))
    events = ports.log.read_run(run_id)
    state = replay(events)
    assert state.status == "completed", state.error
    returned = [e for e in events if isinstance(e, ToolReturned)]
    assert [e.error for e in returned] == [None, None, None]
    # Every intention before any call: the three requests are adjacent.
    kinds = _types(events)
    first = kinds.index("tool_call_requested")
    assert kinds[first : first + 3] == ["tool_call_requested"] * 3
    requested = [e for e in events if isinstance(e, ToolCallRequested)]
    keys = [e.idempotency_key for e in requested]
    assert len(set(keys)) == 3
    assert sorted(world.done) == sorted(
        f"{e.tool}:{e.idempotency_key}" for e in requested
    )
    assert set(world.done.values()) == {1}
    assert state.tool_calls == 3
    assert state.pending is None
    assert state.pending_tools == []


def test_a_gated_call_waits_without_holding_the_others() -> None:
    settings = _settings()
    world = World(together=2)  # look and fetch meet; wire waits for its decision
    model = ScriptedModel([answer("wire", "look", "fetch"), reply("done")])
    ports, run_id = _start(settings)
    a = agent(world, model, gated=True)
    _work(settings, a)
    state = replay(ports.log.read_run(run_id))
    assert state.status == "paused"
    assert state.waiting is not None
    assert state.waiting.gate == "wire"
    assert sorted(k.split(":")[0] for k in world.done) == ["fetch", "look"]
    ports.log.send(Approve(run_id=run_id, by="ann", gate="wire"))
    _work(settings, a)
    events = ports.log.read_run(run_id)
    state = replay(events)
    assert state.status == "completed", state.error
    assert sorted(k.split(":")[0] for k in world.done) == ["fetch", "look", "wire"]
    paused = [e for e in events if isinstance(e, Interrupted)]
    assert len(paused) == 1


CRASH_POINTS = [
    "after_append:tool_call_requested@1",  # every intention durable, no call made
    "after_action:tool@1",  # one call done, its outcome not durable
    "after_action:tool@3",  # all three done, outcomes partly durable
    "before_append:tool_returned@2",
    "after_append:tool_returned@1",
    "after_claim:tool",  # the ledger's row claimed, the call not made
]


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_a_crash_among_concurrent_calls_resumes_with_each_effect_once(
    point: str,
) -> None:
    settings = _settings()
    world = World()
    model = ScriptedModel([answer("look", "fetch", "send"), reply("done")])
    ports, run_id = _start(settings)
    with pytest.raises(Crash):
        _work(settings, agent(world, model), CrashAt(point))
    _work(settings, agent(world, model))
    state = replay(ports.log.read_run(run_id))
    sends = [k for k in world.done if k.startswith("send:")]
    if state.status == "paused":
        # The ledger's row was claimed and the crash came before its outcome (at
        # the claim itself, or a sibling's crash while the call ran): nobody can
        # tell whether it happened, so a person decides -- never a second call.
        assert state.waiting is not None
        assert state.waiting.reason == "uncertain_effect"
        ports.log.send(
            ProvideInput(run_id=run_id, by="ops", input_json='{"did": "send"}')
        )
        _work(settings, agent(world, model))
        state = replay(ports.log.read_run(run_id))
    assert state.status == "completed", state.error
    assert state.tool_calls == 3
    assert len(sends) <= 1
    # The side effect at most once (calls without side effects may run again).
    assert all(n == 1 for k, n in world.done.items() if k.startswith("send:"))
    assert state.model_calls == 2


def test_calls_in_flight_together_survive_a_snapshot() -> None:
    settings = _settings()
    world = World()
    model = ScriptedModel([answer("look", "fetch", "send"), reply("done")])
    ports, run_id = _start(settings)
    with pytest.raises(Crash):
        _work(
            settings, agent(world, model), CrashAt("after_append:tool_call_requested@1")
        )
    state = replay(ports.log.read_run(run_id))
    assert [p.call_id for p in state.pending_tools] == ["c0", "c1", "c2"]
    assert state.pending is state.pending_tools[0]
    again = from_snapshot(to_snapshot(state))
    assert again.pending_tools == state.pending_tools
    assert again.pending == state.pending
