"""Flow control's places and queue (``ports.Flow``) on every store: a limit holds
across callers, the queue gives places in priority then arrival order, a tenant at
its limit is passed over without losing its place, a failed wake-up gives nothing."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence

import pytest

from es_agents.core.flow import Limits, Queued
from es_agents.ports import Flow, Ports


def _flow(ports: Ports) -> tuple[Flow, str]:
    ports.migrate()
    assert ports.flow is not None
    return ports.flow, f"agent-{uuid.uuid4().hex[:8]}"


def _woken(flow: Flow, agent: str, limits: Limits) -> list[str]:
    woken: list[Queued] = []
    flow.admit(agent, limits, woken.extend)
    return [q.run_id for q in woken]


def test_no_more_places_than_the_limit_among_concurrent_callers(ports: Ports) -> None:
    flow, agent = _flow(ports)
    limits = Limits(max_active=3)
    took: list[str] = []
    lock = threading.Lock()

    def take(n: int) -> None:
        run = f"r{n}"
        if flow.take(agent, run, None, 0, limits):
            with lock:
                took.append(run)

    threads = [threading.Thread(target=take, args=(n,)) for n in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(took) == 3
    assert flow.counts(agent) == (3, 0)
    assert flow.take(agent, took[0], None, 0, limits)  # held: still its own
    flow.release(took[0])
    assert flow.counts(agent) == (2, 0)


def test_queued_runs_get_places_by_priority_then_arrival(ports: Ports) -> None:
    flow, agent = _flow(ports)
    limits = Limits(max_active=1)
    assert flow.take(agent, "first", None, 0, limits)
    for n, (run, priority) in enumerate(
        [("low-1", 0), ("low-2", 0), ("high", 5), ("low-3", 0), ("high-2", 5)]
    ):
        assert not flow.take(agent, run, None, priority, limits)
        flow.enqueue(agent, run, None, priority, since_seq=n + 2)
    assert flow.counts(agent) == (1, 5)
    assert _woken(flow, agent, limits) == []  # no place free
    # A new run does not jump the queue, even with a place free.
    flow.release("first")
    assert not flow.take(agent, "newcomer", None, 0, limits)
    order = []
    for _ in range(5):
        got = _woken(flow, agent, limits)
        assert len(got) == 1
        order += got
        assert flow.take(agent, got[0], None, 0, limits)  # given: it holds it
        flow.release(got[0])
    assert order == ["high", "high-2", "low-1", "low-2", "low-3"]
    assert flow.counts(agent) == (0, 0)


def test_a_requeued_run_keeps_its_place(ports: Ports) -> None:
    flow, agent = _flow(ports)
    limits = Limits(max_active=1)
    assert flow.take(agent, "busy", None, 0, limits)
    flow.enqueue(agent, "a", None, 0, since_seq=3)
    flow.enqueue(agent, "b", None, 0, since_seq=3)
    flow.enqueue(agent, "a", None, 0, since_seq=7)  # queued again (after a crash)
    flow.release("busy")
    woken: list[Queued] = []
    flow.admit(agent, limits, woken.extend)
    assert [(q.run_id, q.since_seq) for q in woken] == [("a", 7)]


def test_a_run_given_a_place_before_its_queue_row_is_not_queued_again(
    ports: Ports,
) -> None:
    """A run whose ``take`` failed is given a place by an admission (which found
    its earlier row) before it writes its queue row again: the row would queue
    it twice, and an admission would spend a place's turn on it."""
    flow, agent = _flow(ports)
    limits = Limits(max_active=1)
    assert flow.take(agent, "busy", None, 0, limits)
    flow.enqueue(agent, "a", None, 0, since_seq=3)
    flow.enqueue(agent, "b", None, 0, since_seq=3)
    assert not flow.take(agent, "a", None, 0, limits)  # woken, no place yet
    flow.release("busy")
    assert _woken(flow, agent, limits) == ["a"]  # a place for "a", its row gone
    flow.enqueue(agent, "a", None, 0, since_seq=5)  # its pause, written after
    assert flow.counts(agent) == (1, 1)  # "a" holds a place; only "b" waits
    assert flow.take(agent, "a", None, 0, limits)
    flow.release("a")
    assert _woken(flow, agent, limits) == ["b"]


def test_a_tenant_at_its_limit_is_passed_over_and_keeps_its_place(
    ports: Ports,
) -> None:
    flow, agent = _flow(ports)
    limits = Limits(max_active=3, max_active_per_tenant=1)
    assert flow.take(agent, "acme-1", "acme", 0, limits)
    assert not flow.take(agent, "acme-2", "acme", 0, limits)  # acme is at its limit
    flow.enqueue(agent, "acme-2", "acme", 0, since_seq=2)
    flow.enqueue(agent, "globex-1", "globex", 0, since_seq=2)
    flow.enqueue(agent, "globex-2", "globex", 0, since_seq=2)
    assert _woken(flow, agent, limits) == ["globex-1"]  # one per tenant
    flow.release("acme-1")
    assert _woken(flow, agent, limits) == ["acme-2"]
    assert flow.counts(agent) == (2, 1)


def test_a_wake_up_not_made_durable_gives_no_place(ports: Ports) -> None:
    flow, agent = _flow(ports)
    limits = Limits(max_active=2)
    flow.enqueue(agent, "waiting", None, 0, since_seq=2)

    def broken(runs: Sequence[Queued]) -> None:
        raise OSError("the log is out of reach")

    with pytest.raises(OSError, match="out of reach"):
        flow.admit(agent, limits, broken)
    assert flow.counts(agent) == (0, 1)
    assert _woken(flow, agent, limits) == ["waiting"]
    assert flow.counts(agent) == (1, 0)


def test_agents_and_prefixes_do_not_share_places(ports: Ports) -> None:
    flow, agent = _flow(ports)
    other = f"{agent}-other"
    limits = Limits(max_active=1)
    assert flow.take(agent, "mine", None, 0, limits)
    assert flow.take(other, "theirs", None, 0, limits)
    assert flow.counts(agent) == (1, 0)


def test_a_named_tenant_has_its_own_limit(ports: Ports) -> None:
    flow, agent = _flow(ports)
    limits = Limits(max_active_per_tenant=1, tenants={"acme": 2})
    assert flow.take(agent, "acme-1", "acme", 0, limits)
    assert flow.take(agent, "acme-2", "acme", 0, limits)  # acme's own limit: 2
    assert not flow.take(agent, "acme-3", "acme", 0, limits)
    assert flow.take(agent, "globex-1", "globex", 0, limits)
    assert not flow.take(agent, "globex-2", "globex", 0, limits)  # the default: 1
    flow.enqueue(agent, "globex-2", "globex", 0, since_seq=2)
    flow.enqueue(agent, "acme-3", "acme", 0, since_seq=2)
    flow.release("acme-1")
    assert _woken(flow, agent, limits) == ["acme-3"]  # globex is still at its 1
    assert flow.counts(agent) == (3, 1)
