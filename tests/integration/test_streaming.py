"""Streaming on the real stack: the research loop through a local server that
streams each answer in pieces (OpenAI's and Anthropic's wire formats, each request
validated with the SDK's streaming type). A client following the run gets every
piece of every answer, and the durable completions are the whole answers; a
worker SIGKILLed in the middle of a streamed answer: the call is asked again
under a new attempt, which streams again, and its completion is the one recorded."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from es_agents.client import Client
from es_agents.core import replay
from es_agents.core.events import ModelCallRequested, ModelResponded
from es_agents.lab.demo import _env
from es_agents.models import call, reply
from es_agents.ports import Delta
from es_agents.settings import KafkaSettings, Settings
from tests.integration.test_commands import until, worker
from tests.integration.test_runtime import _events
from tests.test_support import ROOT
from tests.wire_servers import wire_server

pytestmark = pytest.mark.integration

LONG = (
    "Write-ahead logs make every step durable, and idempotency keys make every "
    "effect happen once: a crash costs a retry, never a duplicate."
)
SCRIPT = [call("search", "c1", query="durable agents"), reply(LONG)]


def _follow(client: Client, run_id: str) -> tuple[list[Delta], threading.Thread]:
    got: list[Delta] = []
    watcher = threading.Thread(
        target=lambda: got.extend(client.stream(run_id, timeout=90)), daemon=True
    )
    watcher.start()
    return got, watcher


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
def test_a_streamed_answer_reaches_a_follower_whole(
    wire: str,
    env: dict[str, str],
    kafka_settings: KafkaSettings,
    database_url: str,
    tmp_path: Path,
) -> None:
    with wire_server(wire, SCRIPT) as server:  # type: ignore[arg-type]
        server.piece_chars, server.piece_gap = 9, 0.01
        env = {**env, "ES_AGENTS_TEST_WIRE_URL": server.url}
        settings = Settings(kafka=kafka_settings, database_url=database_url)
        server.gate.clear()  # the first call waits until show follows the run
        output = tmp_path / "show.jsonl"
        with Client(settings) as client, worker(env, f"tests.agents:talker_{wire}"):
            run = client.start(f"talker-{wire}", '{"topic": "streams"}', wait=0)
            got, watcher = _follow(client, run.run_id)
            with output.open("w") as out_file:
                shown = subprocess.Popen(  # show --follow prints the deltas too
                    [sys.executable, "-m", "es_agents.cli", "show", run.run_id,
                     "--follow", "-o", "json"],
                    cwd=ROOT, env=_env(**env, PYTHONUNBUFFERED="1"),
                    stdout=out_file, text=True,
                )  # fmt: skip
                until(
                    lambda: "model_call_requested" in output.read_text(),
                    what=lambda: (
                        "show following the call in flight: "
                        f"{output.read_text()[-2000:]!r}, {len(server.requests)} "
                        f"model requests, show exited {shown.poll()}"
                    ),
                )
                server.gate.set()
                client.wait(run.run_id, timeout=60)
                watcher.join(60)
                shown.wait(60)
            out = output.read_text()
        assert not watcher.is_alive()
        lines = [json.loads(line) for line in out.splitlines()]
        followed = [line["delta"] for line in lines if "delta" in line]
        assert LONG in "".join(d["text"] for d in followed)
        assert any(line.get("type") == "run_completed" for line in lines)
        assert server.rejected == []
        assert all(r.get("stream") is True for r in server.requests)
        state = replay(_events(kafka_settings, run.run_id))
        assert state.status == "completed", state.error
        calls = {(d.step, d.attempt) for d in got}
        assert len(calls) == 2  # both model calls streamed
        last = max(calls)
        text = "".join(d.text for d in got if (d.step, d.attempt) == last)
        assert text == LONG
        responded = [
            e for e in _events(kafka_settings, run.run_id)
            if isinstance(e, ModelResponded)
        ]  # fmt: skip
        assert responded[0].tool_calls[0].name == "search"  # assembled from pieces
        assert responded[-1].content == LONG


def test_a_worker_killed_mid_stream_streams_the_call_again(
    env: dict[str, str], kafka_settings: KafkaSettings, database_url: str
) -> None:
    with wire_server("openai", SCRIPT) as server:
        server.piece_chars, server.piece_gap = 6, 0.05  # about 1.2 s per answer
        env = {**env, "ES_AGENTS_TEST_WIRE_URL": server.url}
        settings = Settings(kafka=kafka_settings, database_url=database_url)
        with Client(settings) as client:
            run = client.start("talker-openai", '{"topic": "crash"}', wait=0)
            got, watcher = _follow(client, run.run_id)
            # The same instance id: the new worker takes the partitions at once.
            same = ("--instance-id", f"talker-{run.run_id}")
            with worker(env, "tests.agents:talker_openai", *same) as first:
                until(
                    lambda: any(d.kind == "text" and d.text in LONG for d in got),
                    what="the answer streaming",
                )
                os.kill(first.pid, signal.SIGKILL)
                first.wait(30)
                first.returncode = 0  # killed on purpose: the context checks 0
            started = time.monotonic()
            with worker(env, "tests.agents:talker_openai", *same):
                client.wait(run.run_id, timeout=90)
                watcher.join(60)
            assert time.monotonic() - started < 90
        events = _events(kafka_settings, run.run_id)
        state = replay(events)
        assert state.status == "completed", state.error
        requested = [e for e in events if isinstance(e, ModelCallRequested)]
        last = requested[-1]
        assert last.attempt == 2  # the dangling call asked again, once
        streamed = "".join(d.text for d in got if (d.step, d.attempt) == (last.step, 2))
        assert streamed == LONG
        assert next(d.kind for d in got if d.attempt == 2) == "start"
        responded = [e for e in events if isinstance(e, ModelResponded)]
        assert len(responded) == 2
        assert responded[-1].content == LONG
        assert len(server.requests) == 3  # the killed call, then its new attempt
