"""MCP tools on the real stack: a worker whose tools a real MCP server serves
(streamable HTTP, and stdio), killed at each protocol point around the calls:
each effect happens once, with the key its intention recorded; no recorded model
answer is asked for again; the run ends as it does uncrashed."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from es_agents.adapters.kafka import KafkaEventLog
from es_agents.core import RunState, replay
from es_agents.core.commands import StartRun
from es_agents.core.events import Event, ModelCallRequested, ToolCallRequested
from es_agents.lab.demo import cli, run_worker
from es_agents.settings import KafkaSettings
from tests.integration.test_commands import until
from tests.mcp_servers import effects
from tests.test_support import ROOT

pytestmark = pytest.mark.integration

HTTP = "tests.mcp_agents:desk_http"
STDIO = "tests.mcp_agents:desk_stdio"


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


def _start(settings: KafkaSettings) -> str:
    run_id = f"run-{uuid.uuid4().hex[:10]}"
    log = KafkaEventLog(settings)
    try:
        log.send(StartRun(run_id=run_id, agent="mcp-desk", input_json='"Refund 7"'))
    finally:
        log.close()
    return run_id


def _events(settings: KafkaSettings, run_id: str) -> list[Event]:
    log = KafkaEventLog(settings)
    try:
        return log.read_run(run_id)
    finally:
        log.close()


def _to_rest(
    env: dict[str, str], settings: KafkaSettings, run_id: str, agent: str
) -> RunState:
    done = run_worker(env, agent=agent, instance_id="w1")
    assert done.returncode == 0, done.stderr[-3000:]
    return replay(_events(settings, run_id))


def _run(
    env: dict[str, str],
    settings: KafkaSettings,
    agent: str,
    crash: tuple[int, str] | None,
) -> tuple[str, RunState]:
    """A run to its end: to the refund's gate, approved, to the end; the worker
    killed at ``crash`` (before the approval: 0, after it: 1) once."""
    run_id = _start(settings)
    for phase in (0, 1):
        if phase == 1:
            approved = cli(env, "approve", run_id, "--by", "ann")
            assert approved.returncode == 0, approved.stderr
        if crash is not None and crash[0] == phase:
            died = run_worker(
                {**env, "ES_AGENTS_CRASH_AT": crash[1]}, agent=agent, instance_id="w1"
            )
            assert died.returncode == -signal.SIGKILL, died.stderr[-3000:]
        state = _to_rest(env, settings, run_id, agent)
        if phase == 0:
            assert state.status == "paused", state
            assert state.waiting is not None
            assert state.waiting.gate == "refund"
    return run_id, state


def _check_once(env: dict[str, str], settings: KafkaSettings, run_id: str) -> None:
    events = _events(settings, run_id)
    keys = {
        e.tool: e.idempotency_key for e in events if isinstance(e, ToolCallRequested)
    }
    mine = [
        e
        for e in effects(Path(env["ES_TEST_MCP_EFFECTS"]))
        if str(e["key"]).startswith(run_id)
    ]
    assert [(e["tool"], e["key"]) for e in mine] == [
        ("send_email", keys["send_email"]),
        ("refund", keys["refund"]),
    ]
    requested = Counter(
        e.messages_hash for e in events if isinstance(e, ModelCallRequested)
    )
    calls = Path(env["ES_AGENTS_MODEL_CALLS_LOG"])
    issued = Counter(
        json.loads(line)["hash"] for line in calls.read_text().splitlines()
    )
    for digest, n in issued.items():
        assert n <= requested[digest], (digest, n, requested[digest])


CRASHES = [
    (0, "after_append:tool_call_requested@2"),  # the email's intention durable
    (0, "after_action:tool@2"),  # the email sent, its outcome not durable
    (0, "after_append:tool_returned@2"),  # its outcome durable
    (0, "after_action:model@2"),  # the model answered, not recorded
    (1, "after_append:tool_call_requested@1"),  # the refund's intention durable
    (1, "after_action:tool@1"),  # the refund made, its outcome not durable
]


@pytest.mark.parametrize("crash", CRASHES, ids=[f"{p}-{c}" for p, c in CRASHES])
def test_killed_at_each_point_each_effect_happens_once(
    crash: tuple[int, str], mcp_env: dict[str, str], kafka_settings: KafkaSettings
) -> None:
    run_id, state = _run(mcp_env, kafka_settings, HTTP, crash)
    assert state.status == "completed", state
    # As uncrashed: four answers (three calls, the reply) and the reply.
    assert json.loads(state.output_json or "{}") == {"answer": "Done: refunded."}
    assert state.model_calls == 4
    _check_once(mcp_env, kafka_settings, run_id)


def test_a_stdio_server_serves_a_run_through_a_crash(
    mcp_env: dict[str, str], kafka_settings: KafkaSettings
) -> None:
    run_id, state = _run(mcp_env, kafka_settings, STDIO, (0, "after_action:tool@2"))
    assert state.status == "completed", state
    assert state.model_calls == 4
    assert json.loads(state.output_json or "{}") == {"answer": "Done: refunded."}
    _check_once(mcp_env, kafka_settings, run_id)
