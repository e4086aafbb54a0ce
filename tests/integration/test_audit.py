"""``es-agents audit``: the whole events topic checked from the log alone, with the
cost ledger; exit 1 when a check fails."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest

from es_agents.adapters.kafka import KafkaEventLog
from es_agents.core.events import ToolCallRequested
from es_agents.lab.demo import cli, script
from es_agents.settings import KafkaSettings

pytestmark = pytest.mark.integration

PRICES = {"scripted": {"input": 3.0, "output": 15.0}}


def _audit(
    env: dict[str, str], tmp_path: Path, *args: str
) -> tuple[int, dict[str, object]]:
    report = tmp_path / "audit.json"
    done = cli(
        {**env, "ES_AGENTS_PRICES": json.dumps(PRICES)},
        "audit",
        "--report",
        str(report),
        *args,
    )
    assert done.returncode in (0, 1), done.stderr[-3000:]
    return done.returncode, json.loads(report.read_text())


def test_audit_finds_what_the_log_and_its_views_disagree_on(
    env: dict[str, str],
    kafka_settings: KafkaSettings,
    database_url: str,
    tmp_path: Path,
) -> None:
    clean = script("ok-run", steps=2)
    gap = script("bad-gap", steps=1)
    twice = script("bad-twice", steps=1)
    open_run = script("ok-open", steps=1)[:3]  # the model asked for a tool
    open_run.append(
        ToolCallRequested(
            run_id="ok-open",
            seq=3,
            step=2,
            call_id="c1",
            tool="send",
            args_json="{}",
            idempotency_key="ok-open:2",
        )
    )
    log = KafkaEventLog(kafka_settings)
    try:
        for events in (clean, open_run, twice, [twice[2]]):
            log.append(events)
        log.append([e for e in gap if e.seq != 2])  # seq 2 never written
    finally:
        log.close()
    assert cli(env, "projector", "--until-caught-up").returncode == 0

    code, report = _audit(env, tmp_path, "--run-prefix", "ok-")
    assert code == 0, report["problems"]
    assert report["runs"] == 2
    assert report["dangling_intentions"] == {
        "ok-open": "tool call ok-open:2 (seq 3): reconciled by key when the run resumes"
    }
    cost = report["cost"]
    assert isinstance(cost, dict)
    priced = [e for e in clean if e.wire_name == "model_responded"]
    want = sum(
        (e.usage.prompt_tokens * 3.0 + e.usage.completion_tokens * 15.0) / 1e6  # type: ignore[attr-defined]
        for e in priced
    )
    assert cost["per_run"]["ok-run"]["cost_usd"] == round(want, 6)
    assert cost["per_run"]["ok-run"]["model_calls"] == len(priced)
    agent = clean[0].agent  # type: ignore[attr-defined]
    assert cost["per_agent"][agent]["runs"] == 2
    assert float(str(report["ratio_audit_to_bare"])) > 0

    # The views disagree with the log: a ledger claim with no outcome, a runs row.
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO effects (idempotency_key, run_id, step, tool, status) "
            "VALUES ('ok-run:9', 'ok-run', 9, 'send', 'done')"
        )
        conn.execute("UPDATE runs SET model_calls = 99 WHERE run_id = 'ok-run'")
    code, report = _audit(env, tmp_path)
    assert code == 1
    problems = report["problems"]
    assert isinstance(problems, dict)
    assert problems["bad-gap"] == ["seq 2..2: missing (gap)"]
    assert problems["bad-twice"] == [f"seq 2: appears again after seq {twice[-1].seq}"]
    assert (
        "effect ok-run:9: done in the ledger, no outcome in the log"
        in problems["ok-run"]
    )
    assert any(
        p.startswith("runs.model_calls: projection 99") for p in problems["ok-run"]
    )
    assert "ok-open" not in problems
    assert report["problem_count"] == 4
