"""A thread on the real stack: the support desk example through a local server
speaking OpenAI's wire format strictly, under `es-agents serve`. The customer's
messages continue one transcript; a refund waits for a person across a worker
kill and is made once; `runs` lists the thread's last message; the thread ends
with its last answer."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid

import psycopg
import pytest

from es_agents.lab.demo import _env, cli
from es_agents.models import call, reply
from tests.integration.test_commands import until, worker
from tests.integration.test_serve import _worker_pid
from tests.test_support import ROOT
from tests.wire_servers import wire_server

pytestmark = pytest.mark.integration

SCRIPT = [
    reply("Sorry to hear that! How can I help?"),
    call("refund", "r1", order=7, amount=19.5),
    reply("Order 7 is refunded: 19.50 EUR."),
    reply("You're welcome. Bye!"),
]


def _status(env: dict[str, str], run: str) -> dict[str, object]:
    done = cli(env, "status", run, "-o", "json")
    assert done.returncode == 0, done.stderr
    value = json.loads(done.stdout)
    assert isinstance(value, dict)
    return value


def test_a_support_thread_across_a_worker_kill(
    env: dict[str, str], database_url: str
) -> None:
    with wire_server("openai", SCRIPT) as server:
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
        try:
            started = cli(env, "start", "support-desk", "--input",
                          '"Hi, my order 7 arrived broken."')  # fmt: skip
            assert started.returncode == 0, started.stderr
            run = started.stdout.strip()
            until(lambda: _status(env, run)["waiting"] == "awaiting_message",
                  what="the first answer")  # fmt: skip

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
            approved = cli(env, "approve", run, "--by", "lead", "--wait", "60")
            assert approved.returncode == 0, approved.stderr
            until(lambda: _status(env, run)["waiting"] == "awaiting_message",
                  what="the answer after the refund")  # fmt: skip

            thanks = cli(env, "say", run, "Thanks", "--by", "cus", "-o", "json")
            assert thanks.returncode == 0, thanks.stderr
            answer = json.loads(thanks.stdout)
            assert answer["reply"] == "You're welcome. Bye!"
            assert answer["turn"] == 2
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
                "turns": 2,
            }
            assert status["turns"] == 2
        finally:
            serve.send_signal(signal.SIGTERM)
            _, err = serve.communicate(timeout=90)
        assert serve.returncode == 0, err[-3000:]

        assert server.rejected == []
        assert len(server.requests) == 4  # no model call asked twice
        users = [
            m["content"] for m in server.requests[-1]["messages"] if m["role"] == "user"
        ]
        assert users == [
            '"Hi, my order 7 arrived broken."',
            "Can I get a refund?",
            "Thanks",
        ]
    with psycopg.connect(database_url) as conn:
        refunds = conn.execute(
            "SELECT order_id, amount FROM desk_refunds WHERE idempotency_key LIKE %s",
            (f"{run}:%",),
        ).fetchall()
    assert [(r[0], float(r[1])) for r in refunds] == [(7, 19.5)]


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
