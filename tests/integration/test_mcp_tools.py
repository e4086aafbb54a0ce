"""MCP tools on the real stack: a worker whose tools a real MCP server serves
(streamable HTTP, and stdio), killed at each protocol point around the calls:
each effect happens once, with the key its intention recorded; no recorded model
answer is asked for again; the run ends as it does uncrashed."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from es_agents.settings import KafkaSettings
from tests.integration.gated_runs import (
    Crash,
    effect_lines,
    effects_once,
    gated_run,
    model_answers_not_asked_again,
)
from tests.integration.test_commands import until
from tests.test_support import ROOT

pytestmark = pytest.mark.integration

HTTP = ("mcp-desk", "tests.mcp_agents:desk_http")
STDIO = ("mcp-desk", "tests.mcp_agents:desk_stdio")
TOOLS = ["send_email", "refund"]  # the effects (lookup_order only reads)


@pytest.fixture
def mcp_env(env: dict[str, str], tmp_path: Path) -> Iterator[dict[str, str]]:
    """The env with an MCP server on streamable HTTP, its effects in a file."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    effects_file = tmp_path / "effects.jsonl"
    server_env = {"ES_TEST_MCP_EFFECTS": str(effects_file), "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.mcp_servers", "http", str(port)],
        cwd=ROOT,
        env=server_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def answers() -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        except OSError:
            return False
        return True

    try:
        until(answers, 30, "the MCP server listens")
        yield {
            **env,
            "ES_TEST_MCP_URL": f"http://127.0.0.1:{port}/mcp",
            "ES_TEST_MCP_EFFECTS": str(effects_file),
        }
    finally:
        server.terminate()
        server.wait(timeout=30)


CRASHES: list[Crash] = [
    (0, "after_append:tool_call_requested@2"),  # the email's intention durable
    (0, "after_action:tool@2"),  # the email sent, its outcome not durable
    (0, "after_append:tool_returned@2"),  # its outcome durable
    (0, "after_action:model@2"),  # the model answered, not recorded
    (1, "after_append:tool_call_requested@1"),  # the refund's intention durable
    (1, "after_action:tool@1"),  # the refund made, its outcome not durable
]


def _check(env: dict[str, str], settings: KafkaSettings, run_id: str) -> None:
    effects_once(
        effect_lines(Path(env["ES_TEST_MCP_EFFECTS"])), settings, run_id, TOOLS
    )
    model_answers_not_asked_again(
        Path(env["ES_AGENTS_MODEL_CALLS_LOG"]), settings, run_id
    )


@pytest.mark.parametrize("crash", CRASHES, ids=[f"{p}-{c}" for p, c in CRASHES])
def test_killed_at_each_point_each_effect_happens_once(
    crash: Crash, mcp_env: dict[str, str], kafka_settings: KafkaSettings
) -> None:
    run_id, state = gated_run(mcp_env, kafka_settings, HTTP, "refund", crash)
    assert state.status == "completed", state
    # As uncrashed: four answers (three calls, the reply) and the reply.
    assert json.loads(state.output_json or "{}") == {"answer": "Done: refunded."}
    assert state.model_calls == 4
    _check(mcp_env, kafka_settings, run_id)


def test_a_stdio_server_serves_a_run_through_a_crash(
    mcp_env: dict[str, str], kafka_settings: KafkaSettings
) -> None:
    crash: Crash = (0, "after_action:tool@2")
    run_id, state = gated_run(mcp_env, kafka_settings, STDIO, "refund", crash)
    assert state.status == "completed", state
    assert state.model_calls == 4
    assert json.loads(state.output_json or "{}") == {"answer": "Done: refunded."}
    _check(mcp_env, kafka_settings, run_id)
