"""Sub-agents: a tool call starts a child run of another agent; the parent waits as
a row and the child's end answers the call (its output, or its failure) with its
usage counted in the parent's; several children at once are joined; a crash around
the start starts no second child; a child whose worker died before telling is
found by the parent's timer; cancelling the parent cancels its children."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from es_agents.agent import ToolAgent
from es_agents.core.budget import Budget
from es_agents.core.events import ChildReturned, StatePatched, ToolCall
from es_agents.core.state import AWAITING_CHILDREN
from es_agents.models import Completion, ScriptedModel, reply
from es_agents.testing import AgentHarness, Crashed, VirtualClock
from es_agents.tools import subagent
from es_agents.vault import Cipher


def _fan_out(*tasks: str) -> Completion:
    return Completion(
        content=None,
        tool_calls=tuple(
            ToolCall(
                call_id=f"c{i}", name="researcher", args_json=json.dumps({"task": t})
            )
            for i, t in enumerate(tasks)
        ),
    )


def _lead(*tasks: str) -> ToolAgent:
    return ToolAgent(
        name="lead",
        system_prompt="Split the work between researchers.",
        model=ScriptedModel([_fan_out(*tasks), reply("Both found.")]),
        tool_list=[subagent("researcher")],
    )


def _researcher(answer: str = "a finding") -> ToolAgent:
    return ToolAgent(
        name="researcher",
        system_prompt="Research the task.",
        model=ScriptedModel([reply(answer)]),
    )


Harness = Callable[[Any], AgentHarness]


def test_children_answer_the_calls_that_started_them(es_harness: Harness) -> None:
    lead, researcher = es_harness(_lead("A", "B")), es_harness(_researcher())
    run_id = lead.start(json.dumps("Find A and B"))
    lead.run()
    state = lead.state(run_id)
    assert state.status == "paused"
    assert state.waiting is not None
    assert state.waiting.reason == AWAITING_CHILDREN
    children = state.children
    assert sorted(children.values()) == sorted(
        {f"{run_id}.{n}" for n in (2, 3)}
    )  # from the calls' keys
    researcher.run()
    for child in children.values():
        child_state = researcher.state(child)
        assert child_state.status == "completed"
        assert child_state.parent_run_id == run_id
        assert json.loads(child_state.input_json)["task"] in ("A", "B")
    lead.run()
    state = lead.state(run_id)
    assert state.status == "completed", state
    returned = [e for e in lead.events(run_id) if isinstance(e, ChildReturned)]
    assert len(returned) == 2
    assert all(
        json.loads(e.output_json or "{}") == {"answer": "a finding"} for e in returned
    )
    # The children's model calls count in the parent's (and its budget's).
    assert state.model_calls == 2 + 2
    tools = [m for m in state.transcript if m.get("role") == "tool"]
    assert [json.loads(str(m["content"])) for m in tools] == [
        {"answer": "a finding"}
    ] * 2


@pytest.mark.parametrize(
    "point", ["after_append:tool_call_requested", "after_action:tool"]
)
def test_a_crash_around_the_start_starts_one_child(
    es_harness: Harness, point: str
) -> None:
    lead, researcher = es_harness(_lead("A")), es_harness(_researcher())
    run_id = lead.start()
    with pytest.raises(Crashed):
        lead.run(crash_at=point)
    lead.run()
    researcher.run()
    lead.run()
    assert lead.state(run_id).status == "completed"
    started = [
        e
        for e in lead.events(run_id)
        if isinstance(e, StatePatched) and e.key.startswith("child:")
    ]
    assert len(started) == 1
    child = json.loads(started[0].value_json)
    assert researcher.state(child).status == "completed"
    assert (
        len([e for e in researcher.events(child) if e.wire_name == "run_started"]) == 1
    )


def test_a_child_whose_worker_died_before_telling_is_found_by_the_timer(
    es_harness: Harness, virtual_clock: VirtualClock
) -> None:
    lead, researcher = es_harness(_lead("A")), es_harness(_researcher())
    run_id = lead.start()
    lead.run()
    with pytest.raises(Crashed):  # the child's end durable, the parent not told
        researcher.run(crash_at="after_append:run_completed")
    researcher.run()
    lead.run()
    assert lead.state(run_id).status == "paused"  # nobody told it
    virtual_clock.advance(61)
    lead.run()
    assert lead.state(run_id).status == "completed"


def test_a_failed_child_is_an_error_the_model_reads(es_harness: Harness) -> None:
    failing = ToolAgent(
        name="researcher",
        system_prompt="Research the task.",
        model=ScriptedModel([reply("too long")]),
        output_model=None,
    )
    lead = es_harness(_lead("A"))
    children = es_harness(failing)
    run_id = lead.start()
    lead.run()
    (child,) = lead.state(run_id).children.values()
    children.cancel(child, by="ops")
    children.run()
    lead.run()
    state = lead.state(run_id)
    assert state.status == "completed"
    tool = next(m for m in state.transcript if m.get("role") == "tool")
    assert str(tool["content"]).startswith(f"error: child run {child} cancelled")


def test_cancelling_the_parent_cancels_its_children(es_harness: Harness) -> None:
    lead, researcher = es_harness(_lead("A", "B")), es_harness(_researcher())
    run_id = lead.start()
    lead.run()
    children = list(lead.state(run_id).children.values())
    lead.cancel(run_id, by="ops")
    lead.run()
    assert lead.state(run_id).status == "cancelled"
    researcher.run()
    assert [researcher.state(c).status for c in children] == ["cancelled"] * 2


def test_the_childrens_model_calls_count_in_the_parents_budget(
    es_harness: Harness,
) -> None:
    lead = _lead("A", "B")
    lead.budget = Budget(max_model_calls=3)  # its 1 + its children's 2 leave none
    parent, researcher = es_harness(lead), es_harness(_researcher())
    run_id = parent.start()
    parent.run()
    researcher.run()
    parent.run()
    state = parent.state(run_id)
    assert state.status == "failed"
    assert state.model_calls == 3
    assert "model calls" in (state.error or "")


def test_encrypting_agents_send_their_children_nothing_in_plain_text(
    es_harness: Harness,
) -> None:
    """Before: a child's start carried its task in plain text in the commands topic
    (which never expires), and so did the child's answer to its parent. Now the
    parent's worker seals the task under the child's data key, and the child's
    worker its output under the parent's; each worker opens what it is sent."""
    lead_agent = _lead("find the secret plan")
    researcher_agent = _researcher("the secret plan is here")
    for agent in (lead_agent, researcher_agent):
        agent.encrypted = True
    lead, researcher = es_harness(lead_agent), es_harness(researcher_agent)
    run_id = lead.start(json.dumps("go"))
    lead.run()
    researcher.run()
    lead.run()
    cipher = Cipher(lead.ports.vault)
    state = cipher.reveal(run_id, lead.state(run_id))
    assert state.status == "completed", state
    tools = [m for m in state.transcript if m.get("role") == "tool"]
    assert [json.loads(str(m["content"])) for m in tools] == [
        {"answer": "the secret plan is here"}
    ]
    log = lead.ports.log
    topic = lead.settings.kafka.commands_topic
    raw = b"".join(
        r.value
        for p in range(lead.settings.kafka.partitions)
        for r in log.read_partition(topic, p)
    )
    assert b"secret plan" not in raw
