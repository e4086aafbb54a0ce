"""An OpenAI Agents SDK agent, durable: a triage agent hands off to billing; the
SDK's models (Chat Completions, against a strict local OpenAI server) and tools
run as es-agents steps. The handoff is recorded and the next request is billing's
(its instructions, its tools); ``needs_approval`` is a gate; each tool gets its
call's idempotency key; a crash asks no recorded answer again."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from es_agents.core.events import StatePatched, ToolCallRequested
from es_agents.errors import ConfigError
from es_agents.integrations.openai_agents import durable
from es_agents.testing import AgentHarness, Crashed
from tests.openai_agents_agents import EFFECTS, SCRIPT, triage, triage_agent
from tests.wire_servers import WireServer, wire_server


@pytest.fixture(autouse=True)
def _clear() -> None:
    EFFECTS.clear()


@pytest.fixture
def server() -> Iterator[WireServer]:
    with wire_server("openai", SCRIPT) as s:
        yield s


def _offered(request: dict[str, Any]) -> set[str]:
    return {t["function"]["name"] for t in request.get("tools", [])}


def test_the_graph_of_agents_is_one_durable_agent(server: WireServer) -> None:
    agent = triage(server.url)
    assert agent.name == "triage"
    assert sorted(agent.members) == ["billing", "triage"]
    assert agent.gates == frozenset({"refund"})
    assert sorted(agent.tools) == [
        "lookup_order",
        "refund",
        "send_email",
        "transfer_to_billing",
    ]
    with pytest.raises(ConfigError, match="has no tool nope"):
        durable(triage_agent(server.url), gated={"nope"})


def test_a_handoff_moves_the_run_to_the_other_agent(
    es_harness: Callable[[Any], AgentHarness], server: WireServer
) -> None:
    h = es_harness(triage(server.url))
    run_id = h.start(json.dumps("Where is order 7? Refund it."))
    h.run()
    state = h.state(run_id)
    assert state.status == "paused"
    assert state.waiting is not None
    assert state.waiting.gate == "refund"
    assert state.vars["agent"] == "billing"
    assert any(
        isinstance(e, StatePatched) and e.key == "agent" for e in h.events(run_id)
    )
    h.approve(run_id)
    h.run()
    state = h.state(run_id)
    assert state.status == "completed", state
    assert json.loads(state.output_json or "{}") == {"answer": "Done: refunded."}
    assert server.rejected == []
    first, after = server.requests[0], server.requests[2]
    assert _offered(first) == {"lookup_order", "transfer_to_billing"}
    assert "route customers" in json.dumps(first["messages"][0])
    assert _offered(after) == {"send_email", "refund"}
    assert "handle refunds" in json.dumps(after["messages"][0])
    keys = {
        e.tool: e.idempotency_key
        for e in h.events(run_id)
        if isinstance(e, ToolCallRequested)
    }
    assert [(e["tool"], e["key"]) for e in EFFECTS] == [
        ("send_email", keys["send_email"]),
        ("refund", keys["refund"]),
    ]


def test_a_crash_after_the_handoff_continues_with_billing(
    es_harness: Callable[[Any], AgentHarness], server: WireServer
) -> None:
    h = es_harness(triage(server.url))
    run_id = h.start(json.dumps("Refund 7"))
    with pytest.raises(Crashed):
        h.run(crash_at="after_append:state_patched")
    h.run()
    state = h.state(run_id)
    assert state.vars["agent"] == "billing"
    assert state.waiting is not None
    assert state.waiting.gate == "refund"
    turns = [
        sum(1 for m in r["messages"] if m.get("role") == "assistant")
        for r in server.requests
    ]
    assert turns == [0, 1, 2, 3]  # no answer asked for twice
    assert [e["tool"] for e in EFFECTS] == ["send_email"]


def test_the_examples_load_as_a_worker_loads_them() -> None:
    from es_agents.agent import load_agent  # noqa: PLC0415

    pai = load_agent("examples.pydantic_ai_desk:agent")
    assert (pai.name, declared(pai)) == ("pai-desk", frozenset({"refund"}))
    sdk = load_agent("examples.openai_agents_desk:agent")
    assert (sdk.name, declared(sdk)) == ("triage", frozenset({"refund"}))


def declared(agent: Any) -> frozenset[str]:
    return frozenset(agent.gates)
