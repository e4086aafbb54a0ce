"""The research agent's whole loop on each real model wire format (local servers
that validate every request with the SDK's own types): tool calls, a 429 waited out
(its Retry-After) and the same request made again, the approval gate, a worker
SIGKILLed after the ticket was created, and reconciliation by key -- one ticket,
and every model call in the log."""

from __future__ import annotations

import json

import pytest

from es_agents.client import Client
from es_agents.core import replay
from es_agents.core.events import ModelCallRequested, ModelResponded
from es_agents.lab import research
from es_agents.lab.demo import run_worker, ticket_stats
from es_agents.settings import KafkaSettings, Settings
from tests.integration.test_runtime import _events
from tests.wire_servers import Fault, wire_server

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
def test_the_research_loop_on_a_real_wire(
    wire: str,
    env: dict[str, str],
    kafka_settings: KafkaSettings,
    database_url: str,
    tickets_url: str,
) -> None:
    agent = f"tests.agents:research_{wire}"
    with wire_server(wire, research.SCRIPT) as server:  # type: ignore[arg-type]
        server.fail_next(Fault(429, {"Retry-After": "1"}))
        env = {**env, "ES_AGENTS_TEST_WIRE_URL": server.url}
        settings = Settings(kafka=kafka_settings, database_url=database_url)
        with Client(settings) as client:
            run = client.start(f"research-{wire}", '{"topic": "wires"}', wait=0)
            first = run_worker(env, agent=agent, instance_id="w1")
            assert first.returncode == 0, first.stderr[-3000:]
            paused = client.status(run.run_id)
            assert paused.status == "paused", paused
            assert client.approve(run.run_id, by="ann", wait=0).status == "queued"
        crashed = run_worker(
            {**env, "ES_AGENTS_CRASH_AT": "after_action:tool"},
            agent=agent,
            instance_id="w1",
        )
        assert crashed.returncode == -9, crashed.stderr[-3000:]
        last = run_worker(env, agent=agent, instance_id="w1")
        assert last.returncode == 0, last.stderr[-3000:]

        events = _events(kafka_settings, run.run_id)
        state = replay(events)
        assert state.status == "completed", state.error
        assert state.reconciled_calls == 1
        assert ticket_stats(tickets_url, run.run_id)["tickets"] == 1
        assert server.rejected == []
        requested = [e for e in events if isinstance(e, ModelCallRequested)]
        # Every call the model took is in the log, none re-billed; the 429 (a call
        # it did not take) was waited out and made again as the same request,
        # without a new attempt or a spent retry.
        assert len(server.requests) == 4
        assert server.requests[0] == server.requests[1]
        assert len(requested) == 3
        assert [e.attempt for e in requested] == [1, 1, 1]
        responded = [e for e in events if isinstance(e, ModelResponded)]
        assert len(responded) == 3
        assert {e.model_id for e in responded} == {"served-model-1"}
        assert json.loads(state.output_json or "{}")["answer"].startswith(
            research.SCRIPT[-1].content or "?"
        )
        tools = server.requests[0]["tools"]
        names = {t.get("name") or t["function"]["name"] for t in tools}
        assert names == {"search", "create_ticket"}
