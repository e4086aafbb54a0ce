"""``Subscription``: commands in order with their positions, offsets committed only
when told, poison dead-lettered, and a group's partitions shared out."""

from __future__ import annotations

import functools
import operator
import time
import uuid

from es_agents.core.commands import Approve, Command, StartRun
from es_agents.ports import Ports, Received
from es_agents.settings import Settings


def _poll_until(sub: object, want: int, seconds: float = 60) -> list[Received[Command]]:
    got: list[Received[Command]] = []
    deadline = time.monotonic() + seconds
    while len(got) < want:
        assert time.monotonic() < deadline, f"got {len(got)} of {want}"
        got += sub.poll(timeout=0.2)  # type: ignore[attr-defined]
    return got


def test_commands_arrive_in_order_and_resume_from_the_commit(
    ports: Ports, settings: Settings
) -> None:
    topic, group = settings.kafka.commands_topic, f"g-{uuid.uuid4().hex[:6]}"
    run_id = f"r-{uuid.uuid4().hex[:8]}"
    sent = [StartRun(run_id=run_id, agent="a")] + [
        Approve(run_id=run_id, by=f"p{i}") for i in range(4)
    ]
    positions = [ports.log.send(c) for c in sent]
    assigned: list[list[int]] = []
    sub = ports.subscribe(
        topic, group, ports.log.decode_command, on_assign=assigned.append
    )
    got = _poll_until(sub, 5)
    assert [r.message for r in got] == sent
    assert [(r.partition, r.offset) for r in got] == [
        (p.partition, p.offset) for p in positions
    ]
    assert all(r.key == run_id for r in got)
    assert assigned
    assert sorted(functools.reduce(operator.iadd, assigned, [])) == list(
        range(settings.kafka.partitions)
    )
    deadline = time.monotonic() + 30
    while not sub.caught_up():
        assert time.monotonic() < deadline
        sub.poll(timeout=0.1)
    # Commit the first three only: a new member starts after them.
    assert sub.commit_offsets({got[2].partition: got[2].offset + 1})
    sub.close()
    again = ports.subscribe(topic, group, ports.log.decode_command)
    rest = _poll_until(again, 2)
    assert [r.message for r in rest] == sent[3:]
    again.close()


def test_poison_is_dead_lettered_and_skipped(ports: Ports, settings: Settings) -> None:
    topic, group = settings.kafka.commands_topic, f"g-{uuid.uuid4().hex[:6]}"
    run_id = f"r-{uuid.uuid4().hex[:8]}"
    good = StartRun(run_id=run_id, agent="a")
    bad = ports.log.produce(topic, run_id, b"junk, not avro")
    ports.log.send(good)
    sub = ports.subscribe(topic, group, ports.log.decode_command)
    got = _poll_until(sub, 1)
    assert [r.message for r in got] == [good]
    assert sub.drain_skipped() == [(bad.partition, bad.offset)]
    dlq = list(ports.log.read_partition(settings.kafka.dlq_topic, bad.partition, 0))
    assert [r.value for r in dlq if r.key == run_id] == [b"junk, not avro"]
    reasons = [dict(r.headers).get("es.dlq.reason", b"") for r in dlq]
    assert any(b"not an es-agents message" in reason for reason in reasons)
    sub.close()


def test_two_members_share_the_partitions(ports: Ports, settings: Settings) -> None:
    topic, group = settings.kafka.commands_topic, f"g-{uuid.uuid4().hex[:6]}"
    owned: dict[str, set[int]] = {"a": set(), "b": set()}

    def member(name: str) -> object:
        return ports.subscribe(
            topic,
            group,
            ports.log.decode_command,
            on_assign=owned[name].update,
            on_revoke=owned[name].difference_update,
        )

    a = member("a")
    everything = set(range(settings.kafka.partitions))
    deadline = time.monotonic() + 60
    while owned["a"] != everything:
        assert time.monotonic() < deadline, owned
        a.poll(timeout=0.1)  # type: ignore[attr-defined]
    b = member("b")
    while not (owned["b"] and owned["a"] | owned["b"] == everything):
        assert time.monotonic() < deadline, owned
        a.poll(timeout=0.05)  # type: ignore[attr-defined]
        b.poll(timeout=0.05)  # type: ignore[attr-defined]
    assert not owned["a"] & owned["b"]
    b.close()  # type: ignore[attr-defined]
    while owned["a"] != everything:
        assert time.monotonic() < deadline, owned
        a.poll(timeout=0.1)  # type: ignore[attr-defined]
    a.close()  # type: ignore[attr-defined]
