"""``EventLog`` and ``PartitionWriter``: order, read-your-writes, one event per
(run, seq), and fencing by the partition's epoch."""

from __future__ import annotations

import uuid

import pytest

from es_agents.core.chain import GENESIS, Sealed, verify
from es_agents.core.events import Event, RunStarted, StatePatched
from es_agents.core.fold import replay
from es_agents.errors import FencedError
from es_agents.ports import Ports
from es_agents.runtime.loader import RunLoader
from es_agents.settings import Settings


def _run(run_id: str, first: int, count: int) -> list[Event]:
    events: list[Event] = []
    for seq in range(first, first + count):
        if seq == 0:
            events.append(
                RunStarted(
                    run_id=run_id,
                    seq=0,
                    step=0,
                    agent="contract",
                    input_json="{}",
                    command_id=f"c-{run_id}",
                )
            )
        else:
            events.append(
                StatePatched(
                    run_id=run_id, seq=seq, step=0, key="n", value_json=str(seq)
                )
            )
    return events


def test_appends_read_back_in_order_at_once(ports: Ports, settings: Settings) -> None:
    log = ports.log
    runs = [f"r-{uuid.uuid4().hex[:8]}" for _ in range(5)]
    written: dict[str, list[Event]] = {r: [] for r in runs}
    for round_ in range(4):
        for run_id in runs:
            batch = _run(run_id, round_ * 3, 3)
            positions = log.append(batch)
            # Durable and readable as soon as append returned (read your writes).
            assert [p.partition for p in positions] == [log.partition_for(run_id)] * 3
            assert positions == sorted(positions, key=lambda p: p.offset)
            written[run_id] += batch
            end = log.end_offset(settings.kafka.events_topic, positions[0].partition)
            back = log.read_run(run_id, at_least=end)
            # As written, but sealed: each names its predecessor's digest in prev.
            assert [e.model_copy(update={"prev": b""}) for e in back] == written[run_id]
    for run_id in runs:
        sealed = log.read_sealed(run_id)
        assert [s.event.seq for s in sealed] == list(range(12))
        # Appends of one run in several calls chain on: the log is one chain.
        assert sealed[0].event.prev == GENESIS
        assert verify(run_id, [(s.event, s.value) for s in sealed]) == []


def test_reads_from_an_offset_and_by_partition(
    ports: Ports, settings: Settings
) -> None:
    log = ports.log
    run_id = f"r-{uuid.uuid4().hex[:8]}"
    first = log.append(_run(run_id, 0, 4))
    later = log.append(_run(run_id, 4, 2))
    assert [e.seq for e in log.read_run(run_id, from_offset=later[0].offset)] == [4, 5]
    topic = settings.kafka.events_topic
    records = list(log.read_partition(topic, first[0].partition, first[0].offset))
    mine = [r for r in records if r.key == run_id]
    assert [r.offset for r in mine] == [p.offset for p in first + later]
    assert [log.decode_event(r.value).seq for r in mine] == list(range(6))


def test_a_stale_owner_cannot_append(ports: Ports, settings: Settings) -> None:
    """Invariant 7 on every store: once the partition has a new owner, the old
    owner's writer is refused, and only the owners' accepted events are read."""
    assert settings.fencing == "epochs"  # the default
    run_id = f"r-{uuid.uuid4().hex[:8]}"
    partition = ports.log.partition_for(run_id)
    group = f"{settings.kafka.topic_prefix}.contract"
    heads: dict[str, bytes] = {}

    def sealed(first: int, count: int) -> list[Sealed]:
        """Chained and signed as a worker's writer appends them."""
        out = ports.log.seal(_run(run_id, first, count), heads.get(run_id, GENESIS))
        heads[run_id] = out[-1].digest
        return out

    def take_epoch() -> int:
        return ports.projections.next_epoch(group, partition)

    old = ports.writer(group, partition, take_epoch)
    old.append(sealed(0, 2))
    new = ports.writer(group, partition, take_epoch)  # the next owner
    assert new.epoch > old.epoch
    with pytest.raises(FencedError):
        old.append(sealed(2, 1))
    new.append(sealed(2, 2))
    assert new.committed_end > 0
    with pytest.raises(FencedError):
        old.append(sealed(4, 1))
    events = ports.log.read_run(run_id, at_least=new.committed_end)
    assert [e.seq for e in events] == [0, 1, 2, 3]
    old.close()
    new.close()


def test_a_duplicate_event_never_changes_the_run(
    ports: Ports, settings: Settings
) -> None:
    """A second event with a (run, seq) already in the log: refused by stores that
    can (Postgres, memory); where the log accepts it (Kafka), every reader folds
    the run as if it were not there."""
    run_id = f"r-{uuid.uuid4().hex[:8]}"
    original = _run(run_id, 0, 3)
    ports.log.append(original)
    imposter = StatePatched(run_id=run_id, seq=2, step=0, key="n", value_json='"x"')
    if settings.store == "kafka":
        ports.log.append([imposter])
    else:
        with pytest.raises(FencedError):
            ports.log.append([imposter])
    loader = RunLoader(ports.projections, ports.log, settings.kafka.events_topic)
    assert loader.load(run_id).state == replay(original)
