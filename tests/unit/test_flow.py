"""Flow control on the harness: an agent's limit of active runs holds while its
runs go on, every run completes, the queue lets the highest priority in first and
then keeps arrival order, a queued run can be cancelled, and a run that waits for a
person gives its place to the next one. Plus the pure rules (``core.flow``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel, JsonValue

from es_agents.agent import ToolAgent
from es_agents.core.events import Interrupted, Resumed
from es_agents.core.flow import (
    QUEUED,
    InvalidLimits,
    Limits,
    Queued,
    admit,
    check_priority,
    flow_of,
)
from es_agents.errors import ConfigError
from es_agents.models import ScriptedModel, call, reply
from es_agents.ports import Flow
from es_agents.runtime.context import limits_of
from es_agents.settings import Settings
from es_agents.testing import AgentHarness
from es_agents.tools import ToolContext, tool


class Work(BaseModel):
    what: str


class Inside:
    """How many runs are inside the tool at once, and in which order they came."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0
        self.order: list[str] = []
        self.gate = threading.Event()
        self.gate.set()

    def enter(self, run_id: str) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
            self.order.append(run_id)
        self.gate.wait(timeout=30)
        time.sleep(0.02)  # long enough for other runs to overlap, if they may
        with self.lock:
            self.now -= 1


INSIDE = Inside()


@tool(Work, name="work")
def work(args: Work, ctx: ToolContext) -> JsonValue:
    INSIDE.enter(ctx.run_id)
    return {"done": args.what}


@tool(Work, name="wire", requires_approval=True)
def wire(args: Work, ctx: ToolContext) -> JsonValue:
    INSIDE.enter(ctx.run_id)
    return {"sent": args.what}


def _agent(limits: Limits, tool_name: str = "work") -> ToolAgent:
    return ToolAgent(
        name="limited",
        system_prompt="Work, then say so.",
        model=ScriptedModel(
            [call(tool_name, "c1", what="it"), reply("done")], model_id="scripted"
        ),
        tool_list=[work, wire],
        limits=limits,
    )


@pytest.fixture(autouse=True)
def _fresh() -> None:
    global INSIDE  # noqa: PLW0603 - the tools' shared witness
    INSIDE = Inside()


def test_never_more_active_runs_than_the_limit_and_all_complete(
    es_harness: Callable[[Any], AgentHarness],
) -> None:
    h = es_harness(_agent(Limits(max_active=2)))
    runs = [h.start() for _ in range(8)]
    h.run()
    assert all(h.state(r).status == "completed" for r in runs)
    assert INSIDE.most == 2  # the limit held, and was used
    queued = [
        r
        for r in runs
        if any(isinstance(e, Interrupted) and e.reason == QUEUED for e in h.events(r))
    ]
    assert len(queued) >= 6 - 1  # most waited for a place
    for r in queued:
        resumed = [e for e in h.events(r) if isinstance(e, Resumed)]
        assert [e.reason for e in resumed] == ["admitted"] * len(resumed)
    assert h.ports.flow is not None
    assert h.ports.flow.counts("limited") == (0, 0)  # every place given back


def test_without_limits_the_runs_overlap(
    es_harness: Callable[[Any], AgentHarness],
) -> None:
    h = es_harness(_agent(Limits()))
    runs = [h.start() for _ in range(8)]
    h.run()
    assert all(h.state(r).status == "completed" for r in runs)
    assert INSIDE.most > 2  # what the limit prevents above


def test_the_queue_lets_priority_in_first_then_arrival_order(
    es_harness: Callable[[Any], AgentHarness],
) -> None:
    h = es_harness(_agent(Limits(max_active=1)))
    flow = h.ports.flow
    assert flow is not None
    INSIDE.gate.clear()  # the first run holds the only place until told
    worker = threading.Thread(target=h.run)
    first = h.start(run_id="first")
    worker.start()
    try:
        _until(lambda: INSIDE.order == ["first"])
        sent = []
        for n, (run, priority) in enumerate(
            [("low-1", 0), ("low-2", 0), ("urgent", 9), ("low-3", 0)]
        ):
            sent.append(h.start(run_id=run, priority=priority))
            _until(_queued(flow, n + 1))  # queued in turn
    finally:
        INSIDE.gate.set()
        worker.join(timeout=60)
    assert not worker.is_alive()
    assert INSIDE.order == ["first", "urgent", "low-1", "low-2", "low-3"]
    assert INSIDE.most == 1
    assert all(h.state(r).status == "completed" for r in [first, *sent])
    assert flow_of(h.state("urgent").vars) == (None, 9)


def test_a_run_waiting_for_a_person_gives_its_place_and_queues_when_approved(
    es_harness: Callable[[Any], AgentHarness],
) -> None:
    h = es_harness(_agent(Limits(max_active=1), tool_name="wire"))
    gated = h.start(run_id="gated")
    h.run()
    assert h.state(gated).waiting is not None
    assert h.state(gated).waiting.reason == "awaiting_approval"  # type: ignore[union-attr]
    plain = ToolAgent(**{**_agent(Limits(max_active=1)).__dict__})
    h.agent = plain
    other = h.start(run_id="other")  # the place is free: it runs at once
    h.run()
    assert h.state(other).status == "completed"
    assert not any(
        isinstance(e, Interrupted) and e.reason == QUEUED for e in h.events(other)
    )
    h.approve(gated)
    h.run()
    assert h.state(gated).status == "completed"


def test_a_queued_run_can_be_cancelled(
    es_harness: Callable[[Any], AgentHarness],
) -> None:
    h = es_harness(_agent(Limits(max_active=1)))
    INSIDE.gate.clear()
    worker = threading.Thread(target=h.run)
    h.start(run_id="holder")
    worker.start()
    flow = h.ports.flow
    assert flow is not None
    try:
        _until(lambda: INSIDE.order == ["holder"])
        h.start(run_id="queued")
        _until(lambda: flow.counts("limited")[1] == 1)
        h.cancel("queued")
        _until(lambda: h.state("queued").status == "cancelled")
    finally:
        INSIDE.gate.set()
        worker.join(timeout=60)
    assert INSIDE.order == ["holder"]  # the cancelled run never worked
    assert flow.counts("limited") == (0, 0)


def _queued(flow: Flow, n: int) -> Callable[[], bool]:
    return lambda: flow.counts("limited")[1] == n


def _until(check: Callable[[], bool], seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "not within the deadline"
        time.sleep(0.01)


# -- the pure rules --------------------------------------------------------------------
def test_limits_and_priorities_are_checked() -> None:
    with pytest.raises(InvalidLimits):
        Limits(max_active=0)
    with pytest.raises(InvalidLimits):
        Limits(max_active_per_tenant=True)
    with pytest.raises(InvalidLimits):
        check_priority(10**7)
    assert not Limits().limited
    assert Limits(max_active_per_tenant=2).limited
    assert Limits(tenants={"acme": 2}).limited
    with pytest.raises(InvalidLimits, match="the limit of tenant 'acme'"):
        Limits(tenants={"acme": 0})
    with pytest.raises(InvalidLimits, match="tenant must be a text"):
        Limits(tenants={"": 3})


def test_a_named_tenant_has_its_own_limit_and_the_others_the_default() -> None:
    limits = Limits(max_active=5, max_active_per_tenant=1, tenants={"acme": 3})
    assert limits.of_tenant("acme") == 3
    assert limits.of_tenant("globex") == 1
    assert limits.of_tenant(None) == 1
    queue = [Queued(f"a{n}", "acme", 0, n, 2) for n in range(4)]
    queue += [Queued("g1", "globex", 0, 9, 2), Queued("g2", "globex", 0, 10, 2)]
    taken = admit(queue, {}, limits)
    assert [q.run_id for q in taken] == ["a0", "a1", "a2", "g1"]


def test_the_settings_add_tenants_limits_to_the_agents() -> None:
    agent = ToolAgent(
        name="limited",
        system_prompt="Answer.",
        model=ScriptedModel([reply("ok")]),
        limits=Limits(max_active_per_tenant=2, tenants={"acme": 4, "trial": 1}),
    )
    settings = Settings(tenant_limits={"acme": 10, "big": 50})
    limits = limits_of(agent, settings)
    assert limits.tenants == {"acme": 10, "trial": 1, "big": 50}
    assert limits.max_active_per_tenant == 2
    with pytest.raises(ConfigError, match="the limit of tenant 'x'"):
        limits_of(agent, Settings(tenant_limits={"x": -1}))


def test_admit_orders_and_respects_both_limits() -> None:
    queue = [
        Queued("a1", "a", 0, 1, 2),
        Queued("b1", "b", 0, 2, 2),
        Queued("a2", "a", 3, 3, 2),
        Queued("c1", None, 0, 4, 2),
    ]
    limits = Limits(max_active=3, max_active_per_tenant=1)
    taken = admit(queue, {"a": 0}, limits)
    assert [q.run_id for q in taken] == ["a2", "b1", "c1"]  # a1: a is full
    assert admit(queue, {"x": 3}, limits) == []
