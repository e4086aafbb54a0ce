"""MCP tools: a real MCP server (the SDK's, in process) serves an agent's tools.
Its schemas are the model's and the tool hash's; each call carries its
idempotency key and fencing token in ``_meta``; a gate holds a chosen MCP tool;
arguments that do not fit the schema never reach the server; a server whose
tool list changed does not continue a run started under the old one."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from es_agents.agent import ToolAgent
from es_agents.core.events import ToolCallRequested, ToolReturned
from es_agents.errors import ConfigError
from es_agents.integrations.mcp import MCPTools
from es_agents.models import ScriptedModel, call, reply
from es_agents.testing import AgentHarness, Crashed
from tests.mcp_servers import EFFECTS, desk


@pytest.fixture(autouse=True)
def _clear() -> None:
    EFFECTS.clear()


def _agent(tools: MCPTools, version: str = "1") -> ToolAgent:
    script = [
        call("lookup_order", "c1", order=7),
        call("send_email", "c2", to="ann@example.com", body="Order 7 arrived."),
        call("refund", "c3", order=7),
        reply("Done: refunded."),
    ]
    return ToolAgent(
        name="desk",
        system_prompt="You are a support desk.",
        model=ScriptedModel(script),
        tool_list=tools.tools(),
        version=version,
    )


def test_the_servers_tools_are_the_models_with_their_schemas() -> None:
    tools = MCPTools(desk(), gated={"refund"})
    by_name = {t.name: t for t in tools.tools()}
    assert sorted(by_name) == ["lookup_order", "refund", "send_email"]
    email = by_name["send_email"].schema()
    assert email["description"] == "Send an email."
    params = email["parameters"]
    assert isinstance(params, dict)
    assert params["required"] == ["to", "body"]
    # The server's hints decide what a crash may do: read-only is called again,
    # anything else is a side effect guarded by the dedupe table.
    assert not by_name["lookup_order"].side_effect
    assert by_name["send_email"].needs_dedupe_table
    assert by_name["refund"].requires_approval
    assert not by_name["send_email"].requires_approval


def test_a_tool_named_that_the_server_lacks_is_refused() -> None:
    with pytest.raises(ConfigError, match="has no tool delete_everything"):
        MCPTools(desk(), gated={"delete_everything"}).tools()


def test_a_run_calls_the_server_with_its_keys_and_waits_at_the_gate(
    es_harness: Callable[[Any], AgentHarness],
) -> None:
    h = es_harness(_agent(MCPTools(desk(), gated={"refund"})))
    run_id = h.start(json.dumps("Where is order 7? Refund it."))
    h.run()
    state = h.state(run_id)
    assert state.status == "paused"
    assert state.waiting is not None
    assert (state.waiting.reason, state.waiting.gate) == ("awaiting_approval", "refund")
    assert [e["tool"] for e in EFFECTS] == ["send_email"]  # the read is no effect

    h.approve(run_id)
    h.run()
    state = h.state(run_id)
    assert state.status == "completed", state
    requested = {
        e.tool: e.idempotency_key
        for e in h.events(run_id)
        if isinstance(e, ToolCallRequested)
    }
    # Each effect once, with the key its intention recorded, and a fencing token.
    assert [(e["tool"], e["key"]) for e in EFFECTS] == [
        ("send_email", requested["send_email"]),
        ("refund", requested["refund"]),
    ]
    assert all(str(e["fencing"]).startswith("p") for e in EFFECTS)
    returned = [e for e in h.events(run_id) if isinstance(e, ToolReturned)]
    assert json.loads(returned[0].result_json or "null") == {
        "order": 7,
        "status": "delivered",
    }


def test_arguments_that_do_not_fit_never_reach_the_server(
    es_harness: Callable[[Any], AgentHarness],
) -> None:
    agent = ToolAgent(
        name="desk",
        system_prompt="You are a support desk.",
        model=ScriptedModel([call("send_email", "c1", to=3), reply("Sorry.")]),
        tool_list=MCPTools(desk()).tools(),
    )
    h = es_harness(agent)
    run_id = h.start()
    h.run()
    assert h.state(run_id).status == "completed"
    returned = [e for e in h.events(run_id) if isinstance(e, ToolReturned)]
    assert returned[0].error is not None
    assert "send_email: invalid arguments" in returned[0].error
    assert "body: required" in returned[0].error
    assert EFFECTS == []


def test_a_crash_after_the_call_sends_no_second_email(
    es_harness: Callable[[Any], AgentHarness],
) -> None:
    h = es_harness(_agent(MCPTools(desk(), gated={"refund"})))
    run_id = h.start()
    with pytest.raises(Crashed):
        h.run(crash_at="after_action:tool@2")  # the email sent, not yet recorded
    h.run()
    state = h.state(run_id)
    assert [e["tool"] for e in EFFECTS] == ["send_email"]
    assert state.waiting is not None
    assert state.waiting.gate == "refund"


def test_a_changed_tool_list_does_not_continue_a_run_started_under_the_old(
    es_harness: Callable[[Any], AgentHarness],
) -> None:
    h = es_harness(_agent(MCPTools(desk(), gated={"refund"})))
    run_id = h.start()
    h.run()
    assert h.state(run_id).status == "paused"
    # A worker whose server now lists one more tool: the version gate holds.
    changed = es_harness(_agent(MCPTools(desk(extra_tool=True), gated={"refund"})))
    changed.approve(run_id)
    changed.run()
    state = changed.state(run_id)
    assert state.status == "blocked", state
    assert state.waiting is not None
    assert state.waiting.reason == "version_mismatch"
    assert "tools_hash" in state.waiting.detail_json
    assert [e["tool"] for e in EFFECTS] == ["send_email"]
