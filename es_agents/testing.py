"""Testing your agent: a pytest plugin (loaded by the ``pytest11`` entry point).

Fixtures:

* ``es_harness`` -- ``es_harness(agent)`` gives an ``AgentHarness``: the agent on an
  in-memory stack (the memory adapters pass the same contract suite as Kafka and
  Postgres), or on the real dev stack with ``pytest --es-agents-store=kafka`` (its own
  topic prefix and database, dropped afterwards);
* ``scripted_model`` -- ``scripted_model([call(...), reply(...)])``: a model that
  answers a run's n-th turn with the n-th completion;
* ``crash_at`` -- ``crash_at(harness, "after_action:tool")``: the worker dies at
  that protocol point (the test fails if it never gets there);
* ``virtual_clock`` -- the in-memory harnesses' clock for timers:
  ``virtual_clock.advance(seconds)`` (on the dev stack timers use Postgres's clock).

An ``AgentHarness`` starts runs, drives them until they wait (``run()``), decides
gates (``approve``, ``reject``, ``provide_input``, ``cancel``), crashes the worker at
a protocol point (``run(crash_at="after_action:tool@1")``: the worker dies there and
the next ``run()`` recovers the run), and tells what happened (``state``,
``events``, ``timeline``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from es_agents.core.commands import (
    Approve,
    Cancel,
    ProvideInput,
    Reject,
    SendMessage,
    StartRun,
)
from es_agents.core.events import Event
from es_agents.core.fold import replay
from es_agents.core.state import RunState
from es_agents.models import Completion, ScriptedModel
from es_agents.settings import KafkaSettings, Settings

__all__ = ["AgentHarness", "CrashAt", "Crashed", "VirtualClock"]


class Crashed(BaseException):
    """The worker died at a crash point (nothing of the runtime catches it)."""


class VirtualClock:
    """A clock that moves only when told (timers fire by it)."""

    def __init__(self, start: datetime | None = None) -> None:
        self.at = start or datetime.now(UTC)

    def now(self) -> datetime:
        return self.at

    def advance(self, seconds: float) -> datetime:
        self.at += timedelta(seconds=seconds)
        return self.at


class CrashAt:
    """A probe that raises ``Crashed`` the n-th time a point is passed."""

    def __init__(self, point: str) -> None:
        name, _, nth = point.partition("@")
        self.point, self.nth, self.seen = name, int(nth or 1), 0

    def hit(self, point: str) -> None:
        if point == self.point:
            self.seen += 1
            if self.seen == self.nth:
                raise Crashed(point)

    def acked(self, events: Sequence[Event]) -> None:
        pass

    def close(self) -> None:
        pass


class AgentHarness:
    def __init__(self, agent: Any, settings: Settings, clock: VirtualClock) -> None:
        from es_agents.app import _memory, build_ports  # noqa: PLC0415

        self.agent = agent
        self.settings = settings
        self.clock = clock
        self.ports = build_ports(settings)
        self.ports.ensure_topics()
        if settings.store == "memory":
            _memory(settings)["timers"].clock = clock.now

    def close(self) -> None:
        self.ports.close()

    # -- commands ----------------------------------------------------------------------
    def start(
        self,
        input_json: str = "{}",
        run_id: str | None = None,
        budget: dict[str, object] | None = None,
        *,
        tenant: str | None = None,
        priority: int = 0,
    ) -> str:
        """Send a start (``budget``: the run's own limits, ``core.budget``;
        ``tenant`` and ``priority``: its place under the agent's ``Limits``)."""
        run_id = run_id or f"run-{uuid.uuid4().hex[:8]}"
        self.ports.log.send(
            StartRun(
                run_id=run_id,
                agent=self.agent.name,
                input_json=input_json,
                budget_json=None if budget is None else json.dumps(budget),
                tenant=tenant,
                priority=priority,
            )
        )
        return run_id

    def approve(
        self,
        run_id: str,
        by: str = "tester",
        gate: str | None = None,
        args_json: str | None = None,
    ) -> None:
        self.ports.log.send(
            Approve(run_id=run_id, by=by, gate=gate, args_json=args_json)
        )

    def reject(
        self,
        run_id: str,
        by: str = "tester",
        gate: str | None = None,
        reason: str | None = None,
    ) -> None:
        self.ports.log.send(Reject(run_id=run_id, by=by, gate=gate, reason=reason))

    def provide_input(self, run_id: str, input_json: str, by: str = "tester") -> None:
        self.ports.log.send(ProvideInput(run_id=run_id, by=by, input_json=input_json))

    def send_message(
        self, run_id: str, text: str, by: str = "tester", *, end: bool = False
    ) -> None:
        self.ports.log.send(SendMessage(run_id=run_id, by=by, text=text, end=end))

    def cancel(self, run_id: str, by: str = "tester") -> None:
        self.ports.log.send(Cancel(run_id=run_id, by=by))

    # -- the worker --------------------------------------------------------------------
    def run(self, crash_at: str | None = None) -> None:
        """A worker until nothing is left to do (every run waits or ended), timers
        due by the virtual clock fired. ``crash_at``: the worker dies at that
        protocol point (``before_append:<event>``, ``after_append:<event>``,
        ``after_action:model``, ``after_action:tool``, ``@n`` for the n-th time) and
        ``Crashed`` is raised; what it made durable stays."""
        from es_agents.app import build_worker  # noqa: PLC0415

        worker = build_worker(
            self.settings, self.agent, until_idle=True, idle_seconds=0.05
        )
        if crash_at is not None:
            worker.ctx.probe = CrashAt(crash_at)
        worker.run()

    # -- what happened -----------------------------------------------------------------
    def events(self, run_id: str) -> list[Event]:
        return self.ports.log.read_run(run_id)

    def state(self, run_id: str) -> RunState:
        return replay(self.events(run_id))

    def timeline(self, run_id: str) -> list[str]:
        """The run's event types in order (``wire_name``)."""
        return [e.wire_name for e in self.events(run_id)]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--es-agents-store",
        choices=("memory", "kafka"),
        default="memory",
        help="es_harness on the in-memory stack (default) or the real dev stack.",
    )


@pytest.fixture
def crash_at() -> Callable[[AgentHarness, str], None]:
    """``crash_at(harness, point)``: run the harness's worker until it dies at
    ``point``; the test fails if the worker never gets there."""

    def crash(harness: AgentHarness, point: str) -> None:
        try:
            harness.run(crash_at=point)
        except Crashed:
            return
        pytest.fail(f"the worker never reached {point}")

    return crash


@pytest.fixture
def virtual_clock() -> VirtualClock:
    return VirtualClock()


@pytest.fixture
def scripted_model() -> Callable[..., ScriptedModel]:
    def make(script: Sequence[Completion], model_id: str = "scripted") -> ScriptedModel:
        return ScriptedModel(list(script), model_id=model_id)

    return make


@pytest.fixture
def es_harness(
    request: pytest.FixtureRequest, virtual_clock: VirtualClock
) -> Iterator[Callable[[Any], AgentHarness]]:
    store = request.config.getoption("--es-agents-store")
    with ExitStack() as stack:
        if store == "kafka":
            from es_agents.lab.bench import scratch_settings  # noqa: PLC0415

            settings = stack.enter_context(scratch_settings(partitions=2))
        else:
            kafka = KafkaSettings(
                topic_prefix=f"test-{uuid.uuid4().hex[:8]}", partitions=2
            )
            settings = Settings(kafka=kafka, store="memory", payloads="off")

        def make(agent: Any) -> AgentHarness:
            harness = AgentHarness(agent, settings, virtual_clock)
            stack.callback(harness.close)
            return harness

        yield make
