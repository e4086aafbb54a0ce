"""An OpenAI Agents SDK agent on the real stack: a triage agent hands off to
billing, whose refund ``needs_approval``; the SDK's Chat Completions model against
a strict local OpenAI server; the worker killed at every protocol point, the
handoff's included: each effect once with its recorded key, no recorded model
answer asked for again, the same final output."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from es_agents.core import replay
from es_agents.settings import KafkaSettings
from tests.integration.gated_runs import (
    Crash,
    effect_lines,
    effects_once,
    events,
    gated_run,
)
from tests.openai_agents_agents import SCRIPT
from tests.wire_servers import WireServer, wire_server

pytestmark = pytest.mark.integration

AGENT = ("triage", "tests.openai_agents_agents:triage")

# The turns whose answer a crash leaves unrecorded: asked again, once.
ASKED_AGAIN = {"after_action:model@2": {1}, "before_append:model_responded@3": {2}}
CRASHES: list[Crash] = [
    (0, "after_append:model_call_requested@2"),  # intention durable, not called
    (0, "after_action:model@2"),  # the handoff asked for, not recorded
    (0, "before_append:model_responded@3"),  # billing's answer not durable
    (0, "after_append:model_responded@2"),  # the handoff's call durable
    (0, "after_append:state_patched"),  # the run handed to billing
    (0, "after_append:tool_returned@2"),  # the handoff answered
    (0, "after_append:tool_call_requested@2"),  # the email's intention durable
    (0, "after_action:tool@2"),  # the email sent, its outcome not durable
    (0, "before_append:tool_returned@3"),  # the same, at the append itself
    (1, "after_append:tool_call_requested@1"),  # the refund's intention durable
    (1, "after_action:tool@1"),  # the refund made, its outcome not durable
]


@pytest.fixture
def server() -> Iterator[WireServer]:
    with wire_server("openai", SCRIPT) as s:
        yield s


@pytest.mark.parametrize("crash", CRASHES, ids=[f"{p}-{c}" for p, c in CRASHES])
def test_killed_at_each_point_the_run_ends_the_same(
    crash: Crash,
    env: dict[str, str],
    tmp_path: Path,
    kafka_settings: KafkaSettings,
    server: WireServer,
) -> None:
    effects = tmp_path / "effects.jsonl"
    env = {
        **env,
        "ES_AGENTS_TEST_WIRE_URL": server.url,
        "ES_TEST_EFFECTS": str(effects),
    }
    run_id, state = gated_run(env, kafka_settings, AGENT, "refund", crash)
    assert state.status == "completed", state
    assert json.loads(state.output_json or "{}") == {"answer": "Done: refunded."}
    assert state.model_calls == 5
    assert state.vars["agent"] == "billing"
    assert replay(events(kafka_settings, run_id)) == state
    effects_once(
        effect_lines(effects), kafka_settings, run_id, ["send_email", "refund"]
    )
    assert server.rejected == []
    turns = Counter(
        sum(1 for m in r["messages"] if m.get("role") == "assistant")
        for r in server.requests
    )
    assert sorted(turns) == [0, 1, 2, 3, 4]
    again = {t for t, n in turns.items() if n > 1}
    assert again == ASKED_AGAIN.get(crash[1], set())
