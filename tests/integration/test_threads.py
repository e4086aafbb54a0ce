"""A thread on the real stack: the support desk example through a local server
speaking OpenAI's wire format strictly (each answer streamed), under `es-agents
serve`. The customer's messages continue one transcript; a refund waits for a
person across a worker kill, is approved with edited arguments and made once with
them; a second refund is rejected with a reason the model answers; a client
follows an answer as it streams; `runs` lists the thread's last message; the
thread ends with its last answer. And a gate's deadline on the durable timers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import uuid

import psycopg
import pytest

from es_agents.client import Client
from es_agents.lab.demo import _env, cli
from es_agents.models import Completion, call, reply
from es_agents.ports import Delta
from es_agents.settings import KafkaSettings, Settings
from tests.integration.test_commands import until, worker
from tests.integration.test_serve import _worker_pid
from tests.test_support import ROOT
from tests.wire_servers import wire_server

pytestmark = pytest.mark.integration

SORRY = "I cannot refund order 8: it was refunded last week. Anything else?"
SCRIPT: list[Completion] = [
    reply("Sorry to hear that! How can I help?"),
    call("refund", "r1", order=7, amount=19.5),
    reply("Order 7 is refunded: 10 EUR."),
    call("refund", "r2", order=8, amount=5),
    reply(SORRY),
    reply("You're welcome. Bye!"),
]


def _status(env: dict[str, str], run: str) -> dict[str, object]:
    done = cli(env, "status", run, "-o", "json")
    assert done.returncode == 0, done.stderr
    value = json.loads(done.stdout)
    assert isinstance(value, dict)
    return value


def _waits(env: dict[str, str], run: str, reason: str, what: str) -> None:
    until(lambda: _status(env, run)["waiting"] == reason, what=what)


def test_a_support_thread_across_a_worker_kill(  # noqa: PLR0915 - one conversation
    env: dict[str, str], kafka_settings: KafkaSettings, database_url: str
) -> None:
    with wire_server("openai", SCRIPT) as server:
        server.piece_chars = 7
        env = {
            **env,
            "ES_AGENTS_MODEL_PROVIDER": "openai",
            "ES_AGENTS_MODEL_BASE_URL": server.url,
            "ES_AGENTS_MODEL_NAME": "desk-model",
            "ES_AGENTS_MODEL_API_KEY": "test",
        }
        serve = subprocess.Popen(
            [sys.executable, "-m", "es_agents.cli", "serve", "--agent",
             "examples.support_desk:agent",
             "--instance-id", f"desk-{uuid.uuid4().hex[:6]}"],
            cwd=ROOT, env=_env(**env), stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        settings = Settings(kafka=kafka_settings, database_url=database_url)
        client = Client(settings)
        try:
            started = cli(env, "start", "support-desk", "--input",
                          '"Hi, my order 7 arrived broken."')  # fmt: skip
            assert started.returncode == 0, started.stderr
            run = started.stdout.strip()
            _waits(env, run, "awaiting_message", "the first answer")

            asked = cli(env, "say", run, "Can I get a refund?", "--by", "cus")
            assert asked.returncode == 0, asked.stderr
            assert "awaiting_approval" in asked.stderr  # the refund waits
            # A message while it waits for the decision is refused, with the reason.
            early = cli(env, "say", run, "hello?", "--by", "cus")
            assert early.returncode == 1
            assert "not waiting for a message" in early.stderr

            first = _worker_pid(serve.pid)
            assert first is not None
            os.kill(first, signal.SIGKILL)  # the worker dies while the run waits
            until(lambda: _worker_pid(serve.pid) not in (None, first),
                  what="a new worker")  # fmt: skip
            # Approved with other arguments: the refund is made with them.
            approved = cli(env, "approve", run, "--by", "lead", "--wait", "60",
                           "--args", '{"order": 7, "amount": 10}')  # fmt: skip
            assert approved.returncode == 0, approved.stderr
            _waits(env, run, "awaiting_message", "the answer after the refund")

            # The next refund is rejected with a reason; the model answers it, and
            # a client follows that answer as it streams.
            more = cli(env, "say", run, "And order 8?", "--by", "cus")
            assert more.returncode == 0, more.stderr
            assert "awaiting_approval" in more.stderr
            followed: list[Delta] = []
            failed: list[BaseException] = []

            def follow() -> None:
                try:
                    for delta in client.stream(run, timeout=60):
                        followed.append(delta)
                except BaseException as e:
                    failed.append(e)

            watcher = threading.Thread(target=follow, daemon=True)
            server.gate.clear()  # the answer to the rejection waits in flight
            rejected = cli(env, "reject", run, "--by", "lead", "--wait", "60",
                           "--reason", "order 8 was refunded last week")  # fmt: skip
            assert rejected.returncode == 0, rejected.stderr
            until(lambda: len(server.requests) == 5, what="the answer asked for")
            watcher.start()  # attached to the call in flight: all of it comes
            until(lambda: any(d.kind == "start" for d in followed),
                  what="the watcher on the call")  # fmt: skip
            server.gate.set()
            _waits(env, run, "awaiting_message", "the answer to the rejection")
            watcher.join(60)
            assert failed == []
            assert "".join(d.text for d in followed if d.kind == "text") == SORRY

            thanks = cli(env, "say", run, "Thanks", "--by", "cus", "-o", "json")
            assert thanks.returncode == 0, thanks.stderr
            answer = json.loads(thanks.stdout)
            assert answer["reply"] == "You're welcome. Bye!"
            assert answer["turn"] == 3
            assert answer["waiting"] == "awaiting_message"

            def listed() -> bool:
                rows = json.loads(cli(env, "runs", "-o", "json").stdout)
                return any(
                    r["run_id"] == run and r["last_message"] == "You're welcome. Bye!"
                    for r in rows
                )

            until(listed, what="runs shows the thread's last message")
            ended = cli(env, "say", run, "--end", "--by", "cus")
            assert ended.returncode == 0, ended.stderr
            until(lambda: _status(env, run)["status"] == "completed", what="end")
            status = _status(env, run)
            assert json.loads(str(status["output"])) == {
                "answer": "You're welcome. Bye!",
                "turns": 3,
            }
            assert status["turns"] == 3
        finally:
            client.close()
            serve.send_signal(signal.SIGTERM)
            _, err = serve.communicate(timeout=90)
        assert serve.returncode == 0, err[-3000:]

        assert server.rejected == []
        assert all(r.get("stream") is True for r in server.requests)
        assert len(server.requests) == 6  # no model call asked twice
        last = server.requests[-1]["messages"]
        users = [m["content"] for m in last if m["role"] == "user"]
        assert users == [
            '"Hi, my order 7 arrived broken."',
            "Can I get a refund?",
            "And order 8?",
            "Thanks",
        ]
        tools = [m["content"] for m in last if m["role"] == "tool"]
        assert json.loads(tools[0]) == {"refunded": 7, "amount": 10.0}
        assert tools[1].startswith("error: rejected by lead: the call did not run")
        assert tools[1].endswith("Reason: order 8 was refunded last week")
    with psycopg.connect(database_url) as conn:
        refunds = conn.execute(
            "SELECT order_id, amount FROM desk_refunds WHERE idempotency_key LIKE %s",
            (f"{run}:%",),
        ).fetchall()
    assert [(r[0], float(r[1])) for r in refunds] == [(7, 10.0)]


def test_a_deadline_rejects_a_call_nobody_decided(env: dict[str, str]) -> None:
    """On the durable timers: the gate's deadline passes, the call is rejected,
    the model hears it and answers."""
    with worker(env, "tests.agents:hasty"):
        started = cli(env, "start", "hasty", "--input", "{}")
        assert started.returncode == 0, started.stderr
        run = started.stdout.strip()
        until(lambda: _status(env, run)["status"] == "completed", what="deadline")
    status = _status(env, run)
    assert json.loads(str(status["output"])) == {
        "answer": "No decision came; nothing was moved."
    }
    timeline = cli(env, "replay", run, "-o", "json").stdout
    assert "(deadline)" in timeline
