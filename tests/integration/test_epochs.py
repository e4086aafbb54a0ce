"""Fencing by epochs in the log: a zombie's write that the broker acknowledged after
the heir's claim is left out by every reader -- the projector (across a restart from
its stored floors), a run's loader, replay and audit -- and its writer is told."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from pydantic import SecretStr

from es_agents.adapters.kafka import KafkaEventLog
from es_agents.adapters.kafka_epochs import EpochWriter
from es_agents.adapters.postgres import Database
from es_agents.adapters.postgres_projections import PostgresProjections
from es_agents.app import build_ports, build_projector
from es_agents.audit import audit
from es_agents.core.chain import Sealed
from es_agents.core.epochs import EpochFence, epoch_headers
from es_agents.core.events import Event, RunStarted, StatePatched
from es_agents.dev import DevStack
from es_agents.errors import FencedError
from es_agents.runtime.loader import RunLoader
from es_agents.settings import KafkaSettings, Settings
from tests.integration.test_commands import until

pytestmark = pytest.mark.integration


@pytest.fixture
def fresh_db(dev_stack: DevStack) -> Iterator[str]:
    name = f"es_epochs_{uuid.uuid4().hex[:10]}"
    dev_stack.postgres.create_database(name)
    yield dev_stack.dev.database_url.rsplit("/", 1)[0] + f"/{name}"
    dev_stack.postgres.drop_database(name)


def _patch(run_id: str, seq: int, key: str) -> Event:
    return StatePatched(run_id=run_id, seq=seq, step=0, key=key, value_json="1")


def test_every_reader_leaves_a_zombies_write_out(
    kafka_settings: KafkaSettings, fresh_db: str
) -> None:
    settings = Settings(
        kafka=kafka_settings, database_url=SecretStr(fresh_db), snapshot_every=100
    )
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    group = f"{kafka_settings.topic_prefix}.workers.x"
    log = KafkaEventLog(kafka_settings)
    db = Database(fresh_db)
    db.migrate()
    projections = PostgresProjections(
        db, log.decode_event, settings.projector_group_id, kafka_settings.events_topic
    )
    partition = log.partition_for(run_id)

    def take() -> int:
        return projections.next_epoch(group, partition)

    head = b""

    def sealed(events: list[Event]) -> list[Sealed]:
        return log.seal(events, head)

    try:
        zombie = EpochWriter(log, group, partition, take)
        first = sealed(
            [
                RunStarted(
                    run_id=run_id,
                    seq=0,
                    step=0,
                    agent="x",
                    input_json="{}",
                    command_id="c",
                ),
                _patch(run_id, 1, "before"),
            ]
        )
        zombie.append(first)
        head = first[-1].digest
        # The projector gets this far, then stops: it restarts below from its floors.
        build_projector(settings).run(until_caught_up=True, idle_seconds=0.3)

        heir = EpochWriter(log, group, partition, take)  # the partition moved on
        assert heir.epoch == zombie.epoch + 1
        # The zombie's write that was in flight when the heir claimed: acknowledged
        # by the broker, after the claim.
        late = sealed([_patch(run_id, 2, "zombie")])[0]
        log.link.wait(
            [
                log.link.produce(
                    kafka_settings.events_topic,
                    run_id,
                    late.value,
                    [*epoch_headers(group, zombie.epoch), *late.headers],
                    partition=partition,
                )
            ]
        )
        with pytest.raises(FencedError, match="fenced"):  # its next append
            zombie.append(sealed([_patch(run_id, 2, "zombie-again")]))
        owned = sealed([_patch(run_id, 2, "heir"), _patch(run_id, 3, "heir-2")])
        heir.append(owned)
        zombie.close()
        heir.close()
        # Two events, the zombie's claim, the heir's claim, the late write (and the
        # refused append, if it went out before the zombie's tail saw the claim),
        # the heir's two events.
        assert log.end_offset(kafka_settings.events_topic, partition) >= 7
        _check_readers(settings, log, projections, run_id, heir, owned[-1].digest)
    finally:
        log.close()
        db.close()


def _check_readers(  # noqa: PLR0917 - the scene the test set up
    settings: Settings,
    log: KafkaEventLog,
    projections: PostgresProjections,
    run_id: str,
    heir: EpochWriter,
    head: bytes,
) -> None:
    kafka_settings = settings.kafka
    group, partition = heir.group, heir.partition
    fresh_db = settings.database_url.get_secret_value()
    keys = [e.key for e in log.read_run(run_id)[1:]]  # type: ignore[attr-defined]
    assert keys == ["before", "heir", "heir-2"]  # replay, fork, audit read this

    projector = build_projector(settings)  # a restart: floors from Postgres
    projector.run(until_caught_up=True, idle_seconds=0.3)
    assert projector.fenced_writes >= 1
    with psycopg.connect(fresh_db) as conn:
        rows = conn.execute(
            "SELECT e.seq, t.payload FROM run_events e JOIN run_tails t "
            "USING (run_id, seq) WHERE e.run_id = %s ORDER BY e.seq",
            (run_id,),
        ).fetchall()
        floors = conn.execute(
            "SELECT floors FROM projector_offsets WHERE partition = %s",
            (partition,),
        ).fetchone()
    assert [r[0] for r in rows] == [0, 1, 2, 3]
    assert [getattr(log.decode_event(r[1]), "key", None) for r in rows][1:] == [
        "before",
        "heir",
        "heir-2",
    ]
    assert floors is not None
    assert floors[0] == {group: heir.epoch}

    # A loader that starts at the projector's offset with its floors.
    loaded = RunLoader(projections, log, kafka_settings.events_topic).load(run_id)
    assert loaded.state is not None
    assert loaded.state.seq == 3
    assert loaded.head == head

    ports = build_ports(settings)
    try:
        report = audit(
            ports.log,
            ports.projections,
            ports.ledger,
            events_topic=kafka_settings.events_topic,
            partitions=kafka_settings.partitions,
            prices={},
            run_prefix=run_id,
        )
    finally:
        ports.close()
    assert report.fenced_writes >= 1
    assert report.runs[run_id].problems == []  # the chain holds without it


def test_a_stale_claim_fences_its_own_writer(kafka_settings: KafkaSettings) -> None:
    """A worker that took epoch 1 but was slow to claim: epoch 2 claimed first, so
    the older claim counts for nothing and its writer never acts."""
    log = KafkaEventLog(kafka_settings)
    group = "g-stale"
    partition = 0
    try:
        heir_ready: list[EpochWriter] = []

        def slow_take() -> int:
            # While the slow worker holds epoch 1, another takes 2 and claims.
            heir_ready.append(EpochWriter(log, group, partition, lambda: 2))
            return 1

        with pytest.raises(FencedError, match="epoch 2 claimed"):
            EpochWriter(log, group, partition, slow_take)
        heir_ready[0].close()
    finally:
        log.close()


def test_a_reader_that_follows_a_partition_carries_its_fence(
    kafka_settings: KafkaSettings,
) -> None:
    """A reader reading a partition read after read (``events tail``, the chaos
    watcher) carries the fence from one read to the next: a zombie's write that
    lands after a claim it read in an earlier read is left out."""
    log = KafkaEventLog(kafka_settings)
    topic = kafka_settings.events_topic
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    group = f"{kafka_settings.topic_prefix}.workers.follow"
    partition = log.partition_for(run_id)
    epochs = iter(range(1, 10))
    head = b""

    def sealed(events: list[Event]) -> list[Sealed]:
        return log.seal(events, head)

    def keys(start: int, floors: EpochFence | None) -> tuple[list[str], int]:
        found, end = [], start
        for record in log.read_partition(topic, partition, start, floors=floors):
            found.append(str(getattr(log.decode_event(record.value), "key", "")))
            end = record.offset + 1
        return found, end

    try:
        zombie = EpochWriter(log, group, partition, lambda: next(epochs))
        started = RunStarted(
            run_id=run_id, seq=0, step=0, agent="x", input_json="{}", command_id="c"
        )
        first = sealed([started])
        zombie.append(first)
        head = first[-1].digest
        heir = EpochWriter(log, group, partition, lambda: next(epochs))
        owned = sealed([_patch(run_id, 1, "heir")])
        heir.append(owned)
        head = owned[-1].digest
        fence = EpochFence()
        seen, position = keys(0, fence)  # the heir's claim, then its event
        assert seen == ["", "heir"]
        late = sealed([_patch(run_id, 2, "zombie")])[0]
        log.link.wait(
            [
                log.link.produce(
                    topic,
                    run_id,
                    late.value,
                    [*epoch_headers(group, zombie.epoch), *late.headers],
                    partition=partition,
                )
            ]
        )
        more = sealed([_patch(run_id, 2, "heir-2")])
        heir.append(more)
        zombie.close()
        heir.close()
        assert keys(position, fence)[0] == ["heir-2"]
        # Without the fence carried, the read after the claim counts the zombie.
        assert keys(position, None)[0] == ["zombie", "heir-2"]
    finally:
        log.close()


def test_an_append_waiting_on_its_read_back_is_fenced_when_the_writer_closes(
    kafka_settings: KafkaSettings,
) -> None:
    """The partition is revoked while an append waits to read itself back (a zombie
    waking up): the append is fenced at once, not left to time out."""
    log = KafkaEventLog(kafka_settings)
    group = f"{kafka_settings.topic_prefix}.workers.closing"
    try:
        writer = EpochWriter(log, group, 0, lambda: 1)
        outcome: list[BaseException] = []

        def wait_for_far_offset() -> None:
            try:
                writer._tail.read_past(10**9, timeout=60)
            except BaseException as e:  # the outcome is what is tested
                outcome.append(e)

        waiter = threading.Thread(target=wait_for_far_offset)
        waiter.start()
        began = time.monotonic()
        writer.close()
        waiter.join(10)
        assert not waiter.is_alive()
        assert time.monotonic() - began < 10
        assert len(outcome) == 1
        assert isinstance(outcome[0], FencedError), outcome
        assert "revoked" in str(outcome[0])
    finally:
        log.close()


class _Blind:
    """A tail consumer whose fetches bring nothing (as when its fetch session sits
    on a broker that died), until the tail's stall renews it."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.used = threading.Event()

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        self.used.set()
        time.sleep(timeout)
        return []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def _blind(writer: EpochWriter) -> None:
    blind = _Blind(writer._tail._consumer)
    writer._tail._consumer = blind  # type: ignore[assignment]
    assert blind.used.wait(10), "the tail never fetched again"


def test_an_append_the_tail_is_slow_to_read_is_confirmed_by_the_epoch_store(
    kafka_settings: KafkaSettings,
) -> None:
    """The tail cannot read, the epoch store still names the writer's epoch: the
    append is counted without waiting for the tail (which later reads past it)."""
    log = KafkaEventLog(kafka_settings)
    group = f"{kafka_settings.topic_prefix}.workers.store"
    asked: list[float] = []

    def epoch_now() -> int:
        asked.append(time.monotonic())
        return 1

    try:
        writer = EpochWriter(log, group, 0, lambda: 1, epoch_now=epoch_now)
        _blind(writer)
        began = time.monotonic()
        writer.append([Sealed(_patch("store-run", 0, "a"), b"v")])
        took = time.monotonic() - began
        offset = writer.committed_end - 1
        assert asked, "the epoch store was never asked"
        assert writer._tail.position <= offset, "the tail read it: nothing shown"
        assert took < 2.5, took  # the tail's first kick comes after 3 s
        until(lambda: writer._tail.position > offset, 30, "the tail renewed")
        writer.close()
    finally:
        log.close()


def test_a_zombie_is_fenced_though_its_tail_is_slow(
    kafka_settings: KafkaSettings,
) -> None:
    """The epoch store names the heir's epoch: the zombie's append is not counted
    on the store's word; its tail, once reading again, finds the heir's claim."""
    log = KafkaEventLog(kafka_settings)
    group = f"{kafka_settings.topic_prefix}.workers.zombie"
    epochs = {"now": 1}
    try:
        zombie = EpochWriter(log, group, 0, lambda: 1, epoch_now=lambda: epochs["now"])
        _blind(zombie)
        epochs["now"] = 2
        heir = EpochWriter(log, group, 0, lambda: 2, epoch_now=lambda: epochs["now"])
        with pytest.raises(FencedError, match="epoch 2 claimed"):
            zombie.append([Sealed(_patch("zombie-run", 0, "z"), b"v")])
        heir.append([Sealed(_patch("zombie-run", 0, "h"), b"v")])
        zombie.close()
        heir.close()
    finally:
        log.close()
