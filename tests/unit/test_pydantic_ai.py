"""A Pydantic AI agent, durable: its model (Pydantic AI's OpenAI model, against a
strict local OpenAI server) and its tools run as es-agents steps. What it sends is
what Pydantic AI would (system prompt, instructions, tool schemas); Pydantic AI's
``requires_approval`` is a gate; a tool's ``ModelRetry`` is read by the model;
each tool gets its call's idempotency key; a crash asks no recorded answer again."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pydantic_ai.messages import ToolReturnPart, UserPromptPart

from es_agents.core.events import ToolCallRequested, ToolReturned
from es_agents.errors import ConfigError
from es_agents.integrations.pydantic_ai import durable, to_pydantic_ai
from es_agents.models import call, reply
from es_agents.testing import AgentHarness, Crashed
from tests.pydantic_ai_agents import EFFECTS, SCRIPT, desk, desk_agent
from tests.wire_servers import WireServer, wire_server


@pytest.fixture(autouse=True)
def _clear() -> None:
    EFFECTS.clear()


@pytest.fixture
def server() -> Iterator[WireServer]:
    with wire_server("openai", SCRIPT) as s:
        yield s


def _turns(server: WireServer) -> list[int]:
    """The turn of each request the server was sent (assistant messages in it)."""
    return [
        sum(1 for m in r["messages"] if m.get("role") == "assistant")
        for r in server.requests
    ]


def test_what_the_model_is_sent_is_what_pydantic_ai_would_send(
    server: WireServer,
) -> None:
    agent = desk(server.url)
    assert agent.name == "pai-desk"
    assert agent.gates == frozenset({"refund"})  # requires_approval=True
    by_name = {t.name: t for t in agent.tool_list}
    assert not by_name["lookup_order"].side_effect
    assert by_name["send_email"].needs_dedupe_table
    params = by_name["send_email"].schema()["parameters"]
    assert isinstance(params, dict)
    assert params["required"] == ["to", "body"]
    assert "Be brief." not in agent.system_prompt  # instructions stay instructions
    assert agent.instructions == "Be brief."
    versions = agent.versions()
    other = durable(desk_agent(server.url), name="pai-desk", read_only={"lookup_order"})
    assert other.versions() == versions  # the same agent, the same fingerprint


def test_a_tool_named_that_the_agent_lacks_is_refused(server: WireServer) -> None:
    with pytest.raises(ConfigError, match="has no tool nope"):
        durable(desk_agent(server.url), gated={"nope"})


def test_a_run_pauses_at_the_gate_and_each_effect_happens_once(
    es_harness: Callable[[Any], AgentHarness], server: WireServer
) -> None:
    h = es_harness(desk(server.url))
    run_id = h.start(json.dumps("Where is order 7? Refund it."))
    h.run()
    state = h.state(run_id)
    assert state.status == "paused"
    assert state.waiting is not None
    assert state.waiting.gate == "refund"
    assert [e["tool"] for e in EFFECTS] == ["send_email"]
    h.approve(run_id)
    h.run()
    state = h.state(run_id)
    assert state.status == "completed", state
    assert json.loads(state.output_json or "{}") == {"answer": "Done: refunded."}
    keys = {
        e.tool: e.idempotency_key
        for e in h.events(run_id)
        if isinstance(e, ToolCallRequested)
    }
    assert [(e["tool"], e["key"]) for e in EFFECTS] == [
        ("send_email", keys["send_email"]),
        ("refund", keys["refund"]),
    ]
    assert server.rejected == []  # every request valid on the wire
    assert _turns(server) == [0, 1, 2, 3]  # no answer asked for twice
    first = server.requests[0]
    assert first["messages"][0]["role"] == "system"
    assert "You are a support desk." in json.dumps(first["messages"])
    assert "Be brief." in json.dumps(first["messages"])
    assert first["messages"][-1] == {
        "role": "user",
        "content": "Where is order 7? Refund it.",
    }
    assert {t["function"]["name"] for t in first["tools"]} == {
        "lookup_order",
        "send_email",
        "refund",
    }


def test_a_crash_after_the_email_sends_no_second_one(
    es_harness: Callable[[Any], AgentHarness], server: WireServer
) -> None:
    h = es_harness(desk(server.url))
    run_id = h.start(json.dumps("Refund 7"))
    with pytest.raises(Crashed):
        h.run(crash_at="after_action:tool@2")
    h.run()
    assert h.state(run_id).waiting is not None
    assert [e["tool"] for e in EFFECTS] == ["send_email"]
    assert _turns(server) == [0, 1, 2]


def test_a_model_retry_is_read_by_the_model(
    es_harness: Callable[[Any], AgentHarness],
) -> None:
    script = [call("send_email", "c1", to="nobody", body="hi"), reply("Sorry.")]
    with wire_server("openai", script) as server:
        h = es_harness(desk(server.url))
        run_id = h.start(json.dumps("Email nobody"))
        h.run()
        assert h.state(run_id).status == "completed"
        returned = [e for e in h.events(run_id) if isinstance(e, ToolReturned)]
        assert returned[0].error == "retry: that is no email address"
        tool_message = server.requests[1]["messages"][-1]
        assert tool_message["role"] == "tool"
        assert "that is no email address" in tool_message["content"]
    assert EFFECTS == []


def test_messages_become_pydantic_ai_requests_and_responses() -> None:
    history = to_pydantic_ai(
        [
            {"role": "system", "content": "S"},
            {"role": "user", "content": '"hello"'},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"call_id": "c1", "name": "f", "args_json": "{}"}],
            },
            {"role": "tool", "tool_call_id": "c1", "name": "f", "content": "[1]"},
        ],
        "I",
    )
    kinds = [type(m).__name__ for m in history]
    assert kinds == ["ModelRequest", "ModelResponse", "ModelRequest"]
    assert [type(p).__name__ for p in history[0].parts] == [
        "SystemPromptPart",
        "UserPromptPart",
    ]
    prompt, result = history[0].parts[1], history[2].parts[0]
    assert isinstance(prompt, UserPromptPart)
    assert prompt.content == "hello"
    assert isinstance(result, ToolReturnPart)
    assert result.content == [1]
