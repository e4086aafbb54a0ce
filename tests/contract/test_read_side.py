"""The effect ledger, timers and the command book on every store."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from es_agents.core.commands import Approve, StartRun
from es_agents.errors import ConfigError
from es_agents.ports import Decided, Ports, Verdict


def test_the_ledger_allows_one_call_per_key(ports: Ports) -> None:
    ledger = ports.ledger
    key = f"r-{uuid.uuid4().hex[:8]}:3"
    assert ledger.get(key) is None
    assert ledger.begin(key, "r", 3, "send").status == "new"
    assert ledger.begin(key, "r", 3, "send").status == "started"  # a second caller
    ledger.finish(key, '{"id": 1}', None)
    done = ledger.begin(key, "r", 3, "send")
    assert (done.status, done.result_json) == ("done", '{"id": 1}')
    with pytest.raises(ConfigError):
        ledger.finish(key, "{}", None)  # finished once
    other = f"{key}x"
    ledger.begin(other, "r", 4, "send")
    ledger.release(other)  # provably not called: the owner may call it
    assert ledger.get(other) is None


def test_timers_fire_once_when_due(ports: Ports) -> None:
    timers = ports.timers
    now = datetime.now(UTC)
    due, later = f"t-{uuid.uuid4().hex[:8]}", f"t-{uuid.uuid4().hex[:8]}"
    timers.schedule(due, "run-1", now - timedelta(seconds=1))
    timers.schedule(later, "run-2", now + timedelta(hours=1))
    fired: list[str] = []
    timers.fire_due(lambda due: fired.extend(t for t, _, _ in due))
    timers.fire_due(lambda due: fired.extend(t for t, _, _ in due))
    assert due in fired
    assert fired.count(due) == 1
    assert later not in fired
    found = timers.get(due)
    assert found is not None
    assert found[1] is not None
    timers.schedule(due, "run-1", now - timedelta(seconds=1))  # armed again
    timers.fire_due(lambda due: fired.extend(t for t, _, _ in due))
    assert fired.count(due) == 2


def test_verdicts_applied_are_final_and_starts_are_unique(ports: Ports) -> None:
    book = ports.book
    run_id = f"r-{uuid.uuid4().hex[:8]}"
    start = StartRun(run_id=run_id, agent="a")
    assert book.reserve_start(start, run_exists=False) is None
    assert book.reserve_start(start, run_exists=False) is None  # the same command
    other = StartRun(run_id=run_id, agent="a")
    assert "already pending" in (book.reserve_start(other, run_exists=False) or "")
    approve = Approve(run_id=run_id, by="p")
    book.sent(approve)
    book.decided([Decided(start, "applied"), Decided(approve, "applied")])
    book.decided([Decided(approve, "refused", "late redelivery")])
    verdict = book.verdict(approve.command_id)
    assert verdict is not None
    assert verdict.status == "applied"
    assert {v.command_id for v in book.for_run(run_id)} == {
        start.command_id,
        approve.command_id,
    }
    assert "already exists" in (book.reserve_start(other, run_exists=False) or "")


def test_one_command_decided_twice_at_once_keeps_its_applied_verdict(
    ports: Ports,
) -> None:
    """A command delivered twice (a client re-sent it with the same id, or the log
    redelivered it) and decided twice in one activation: one verdict, the applied one
    (Postgres refuses one upsert touching a row twice -- the worker crashed on it
    over and over in a chaos run)."""
    book = ports.book
    run_id = f"r-{uuid.uuid4().hex[:8]}"
    approve, other = Approve(run_id=run_id, by="p"), Approve(run_id=run_id, by="q")
    book.sent(approve)
    book.decided(
        [
            Decided(approve, "applied"),
            Decided(other, "refused", "not at a gate"),
            Decided(approve, "refused", "already applied"),
            Decided(other, "refused", "not at a gate"),
        ]
    )
    verdicts = {v.command_id: v.status for v in book.for_run(run_id)}
    assert verdicts == {approve.command_id: "applied", other.command_id: "refused"}


def test_a_waiting_sender_gets_its_verdict_with_the_reason(ports: Ports) -> None:
    book = ports.book
    run_id = f"r-{uuid.uuid4().hex[:8]}"
    # 150 decided together (more than one notification's worth), one with a
    # reason too long for a notification's payload: each sender gets its own.
    approves = [Approve(run_id=run_id, by=f"p{i}") for i in range(150)]
    long_reason = "refused: " + "x" * 9000
    for command in approves:
        book.sent(command)
    found: dict[str, object] = {}

    def wait_for(command_id: str) -> None:
        found[command_id] = book.wait_verdict(command_id, timeout=20)

    waiters = [
        threading.Thread(target=wait_for, args=(c.command_id,))
        for c in (approves[0], approves[120], approves[149])
    ]
    for waiter in waiters:
        waiter.start()
    decided = [Decided(c, "applied") for c in approves[:-1]]
    book.decided([*decided, Decided(approves[-1], "refused", long_reason)])
    for waiter in waiters:
        waiter.join(30)
    first, late, refused = (
        found[c.command_id] for c in (approves[0], approves[120], approves[149])
    )
    assert isinstance(first, Verdict)
    assert (first.status, first.run_id, first.type) == ("applied", run_id, "approve")
    assert first.sent_at is not None
    assert first.decided_at is not None
    assert isinstance(late, Verdict)
    assert late.status == "applied"
    assert isinstance(refused, Verdict)
    assert (refused.status, refused.reason) == ("refused", long_reason)
