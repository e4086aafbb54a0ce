"""``es-agents replay``: the timeline from the log, and the projection checked
against the fold (exit 0 consistent, 1 the first differing field, 2 no such run)."""

from __future__ import annotations

import json

import psycopg
import pytest

from es_agents.lab.demo import cli, run_worker

pytestmark = pytest.mark.integration

PRICES = {"scripted-research": {"input": 3.0, "output": 15.0}}


def _replay(env: dict[str, str], run_id: str) -> tuple[int, list[dict[str, object]]]:
    done = cli(
        {**env, "ES_AGENTS_PRICES": json.dumps(PRICES)}, "replay", run_id, "--json"
    )
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    return done.returncode, lines


def test_replay_tells_the_run_and_checks_the_projection(
    env: dict[str, str], database_url: str
) -> None:
    started = cli(
        env,
        "start",
        "research",
        "--queue",
        "--input",
        '{"topic": "audit"}',
        "--no-wait",
    )
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    assert run_worker(env, agent="tests.agents:gated").returncode == 0
    assert cli(env, "approve", run_id, "--by", "alice", "--no-wait").returncode == 0
    assert run_worker(env, agent="tests.agents:gated").returncode == 0
    projected = cli(env, "projector", "--until-caught-up")
    assert projected.returncode == 0, projected.stderr[-2000:]

    code, lines = _replay(env, run_id)
    assert code == 0, lines
    *entries, last = lines
    summary = last["summary"]
    assert isinstance(summary, dict)
    assert summary["consistent"] is True
    assert summary["status"] == "completed"
    _assert_timeline(entries, run_id)

    # A projection that says something the log does not: the first field named.
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("UPDATE runs SET step = step + 1 WHERE run_id = %s", (run_id,))
    code, lines = _replay(env, run_id)
    mismatch = lines[-1]["summary"]["mismatch"]  # type: ignore[index]
    assert code == 1
    assert str(mismatch).startswith("runs.step: projection"), mismatch
    text = cli(env, "replay", run_id)
    assert text.returncode == 1
    assert "MISMATCH: runs.step" in text.stdout
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("UPDATE runs SET step = step - 1 WHERE run_id = %s", (run_id,))
        conn.execute(
            "UPDATE run_snapshots SET state = jsonb_set(state, '{step}', '99') "
            "WHERE run_id = %s AND seq = (SELECT max(seq) FROM run_snapshots "
            "WHERE run_id = %s)",
            (run_id, run_id),
        )
    code, lines = _replay(env, run_id)
    mismatch = lines[-1]["summary"]["mismatch"]  # type: ignore[index]
    assert code == 1
    assert "run_snapshots@" in str(mismatch), mismatch
    assert ".step: projection 99" in str(mismatch), mismatch

    unknown = cli(env, "replay", "no-such-run")
    assert unknown.returncode == 3  # not found
    assert "unknown run no-such-run" in unknown.stderr


def _assert_timeline(entries: list[dict[str, object]], run_id: str) -> None:
    by_type: dict[str, list[dict[str, object]]] = {}
    for entry in entries:
        by_type.setdefault(str(entry["type"]), []).append(entry)
    answers = by_type["model_responded"]
    assert len(answers) == 3
    for answer in answers:
        assert answer["model"] == "scripted-research"
        prompt, completion = answer["prompt_tokens"], answer["completion_tokens"]
        assert isinstance(prompt, int)
        assert isinstance(completion, int)
        assert answer["cost_usd"] == round((prompt * 3.0 + completion * 15.0) / 1e6, 6)
        assert isinstance(answer["latency_ms"], float)
    tools = by_type["tool_call_requested"]
    assert [t["tool"] for t in tools] == ["search", "create_ticket"]
    assert all(str(t["key"]).startswith(f"{run_id}:") for t in tools)
    assert [r["reconciled"] for r in by_type["tool_returned"]] == [False, False]
    (gate,) = by_type["interrupted"]
    assert (gate["reason"], gate["gate"]) == ("awaiting_approval", "create_ticket")
    (resumed,) = by_type["resumed"]
    assert resumed["by"] == "alice"
