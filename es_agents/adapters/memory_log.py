"""The log in memory (``ES_AGENTS_STORE=memory``): one process, for tests.

``MemoryBroker`` holds topics of partitions of records, consumer groups and epochs;
``MemoryEventLog``, ``MemoryPartitionWriter`` and ``MemorySource`` are its ports, with
the same contract as the Kafka and Postgres adapters (``tests/contract``): offsets
gapless per partition, appends visible once they return, ``(run, seq)`` unique, a
writer fenced once its partition's epoch moved on, and a group's partitions spread
over its live members.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar, final

from es_agents.adapters.coded_log import CodedLog
from es_agents.codec import AvroCodec
from es_agents.core.chain import Sealed
from es_agents.core.commands import Command
from es_agents.core.epochs import StartFloors
from es_agents.core.events import Event
from es_agents.dead_letters import DeadLetterQueue
from es_agents.errors import ConfigError, DecodeError, FencedError
from es_agents.partitioner import partition_for
from es_agents.ports import OnAssign, OnLost, OnRevoke, Position, Received, Record

T = TypeVar("T")


@dataclass
class _Group:
    members: list[str] = field(default_factory=list)
    owners: dict[tuple[str, int], str] = field(default_factory=dict)
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)


class MemoryBroker:
    """Everything a memory store holds: shared by the ports built on it."""

    def __init__(self, partitions: int = 6) -> None:
        self.partitions = partitions
        self.topics: dict[str, list[list[Record]]] = {}
        self.seqs: set[tuple[str, str, int]] = set()
        self.epochs: dict[tuple[str, int], int] = {}
        self.groups: dict[str, _Group] = {}
        self.lock = threading.Condition()

    def create(self, topic: str) -> None:
        with self.lock:
            self.topics.setdefault(topic, [[] for _ in range(self.partitions)])

    def partition_count(self, topic: str) -> int:
        with self.lock:
            if topic not in self.topics:
                raise ConfigError(f"topic {topic} does not exist (es-agents topics)")
            return len(self.topics[topic])

    def append(
        self,
        topic: str,
        rows: Sequence[tuple[str, int | None, bytes, tuple[tuple[str, bytes], ...]]],
        fence: tuple[str, int, int] | None = None,
    ) -> list[Position]:
        with self.lock:
            if fence is not None:
                group, partition, epoch = fence
                if self.epochs.get((group, partition)) != epoch:
                    raise FencedError(f"partition {partition} of {group}: fenced")
            n = len(self.topics[topic])
            seqs = [(topic, k, s) for k, s, _, _ in rows if s is not None]
            if any(s in self.seqs for s in seqs) or len(set(seqs)) != len(seqs):
                raise FencedError(f"{topic}: another writer appended these seqs first")
            self.seqs.update(seqs)
            out = []
            for key, _seq, value, headers in rows:
                part = self.topics[topic][partition_for(key, n)]
                position = Position(topic, partition_for(key, n), len(part))
                part.append(
                    Record(
                        topic, position.partition, position.offset, key, value, headers
                    )
                )
                out.append(position)
            self.lock.notify_all()
            return out

    def read(self, topic: str, partition: int, start: int, limit: int) -> list[Record]:
        with self.lock:
            return list(self.topics[topic][partition][start : start + limit])

    def next_epoch(self, group: str, partition: int) -> int:
        with self.lock:
            epoch = self.epochs.get((group, partition), 0) + 1
            self.epochs[(group, partition)] = epoch
            return epoch

    def current_epoch(self, group: str, partition: int) -> int | None:
        with self.lock:
            return self.epochs.get((group, partition))


@final
class MemoryEventLog(CodedLog):
    def __init__(
        self,
        broker: MemoryBroker,
        events_topic: str,
        commands_topic: str,
        codec: AvroCodec | None = None,
        restore: Callable[[Event], Event] | None = None,
    ) -> None:
        self.broker = broker
        self.events_topic = events_topic
        self.commands_topic = commands_topic
        super().__init__(codec, restore)

    def append_sealed(self, records: Sequence[Sealed]) -> list[Position]:
        return self.append_fenced(records, None)

    def append_fenced(
        self, records: Sequence[Sealed], fence: tuple[str, int, int] | None
    ) -> list[Position]:
        rows = [
            (r.event.run_id, r.event.seq, r.value, tuple(r.headers)) for r in records
        ]
        return self.broker.append(self.events_topic, rows, fence)

    def send(self, command: Command) -> Position:
        return self.produce(self.commands_topic, command.run_id, self.encode(command))

    def produce(
        self,
        topic: str,
        key: str,
        value: bytes,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> Position:
        return self.broker.append(topic, [(key, None, value, tuple(headers))])[0]

    def partition_count(self) -> int:
        return self.broker.partition_count(self.events_topic)

    def partition_for(self, run_id: str) -> int:
        return partition_for(run_id, self.partition_count())

    def read_sealed(
        self,
        run_id: str,
        from_offset: int = 0,
        at_least: int = 0,
        restore: bool = True,
        until_seq: int | None = None,
        *,
        floors: Mapping[str, int] | None = None,
    ) -> list[Sealed]:
        events = []
        partition = self.partition_for(run_id)
        for rec in self.read_partition(self.events_topic, partition, from_offset):
            if rec.key == run_id:
                if not self.authored((rec.headers, rec.value)):
                    self.left_out(rec)
                    continue
                try:
                    event = self.codec.decode_event(rec.value)
                except DecodeError as e:
                    self.undecodable(rec, e)
                    continue
                events.append(
                    Sealed(self._restore(event) if restore else event, rec.value)
                )
                if until_seq is not None and event.seq >= until_seq:
                    break
        return events

    def read_partition(
        self,
        topic: str,
        partition: int,
        start: int = 0,
        at_least: int = 0,
        *,
        floors: StartFloors | None = None,
    ) -> Iterator[Record]:
        yield from self.broker.read(topic, partition, start, 1 << 62)

    def end_offset(self, topic: str, partition: int) -> int:
        with self.broker.lock:
            return len(self.broker.topics[topic][partition])

    def close(self) -> None:
        pass


@final
class MemoryPartitionWriter:
    def __init__(self, log: MemoryEventLog, group: str, partition: int, epoch: int):
        self._log = log
        self._fence = (group, partition, epoch)
        self.epoch = epoch
        self._closed = False
        self.committed_end = 0

    def append(self, records: Sequence[Sealed]) -> None:
        if self._closed:
            raise FencedError(f"partition {self._fence[1]}: writer closed (revoked)")
        positions = self._log.append_fenced(records, self._fence)
        if positions:
            self.committed_end = max(self.committed_end, positions[-1].offset + 1)

    def submit(
        self, records: Sequence[Sealed], done: Callable[[Exception | None], None]
    ) -> None:
        """``append`` by callback: in memory it is done at once."""
        try:
            self.append(records)
        except FencedError as e:
            done(e)
        else:
            done(None)

    def close(self) -> None:
        self._closed = True


@final
class MemorySource(Generic[T]):
    """A group member: partition ``p`` belongs to live member ``p mod n``."""

    def __init__(
        self,
        broker: MemoryBroker,
        topic: str,
        group_id: str,
        decode: Callable[[bytes], T],
        dlq: DeadLetterQueue,
        *,
        on_assign: OnAssign | None = None,
        on_revoke: OnRevoke | None = None,
        on_lost: OnLost | None = None,
        instance_id: str | None = None,
        gather_ms: int = 0,  # reads return what is there
    ) -> None:
        self.broker = broker
        self.topic = topic
        self._decode = decode
        self._dlq = dlq
        self._on_assign = on_assign
        self._on_revoke = on_revoke
        self._on_lost = on_lost or on_revoke
        self._lose_for: float | None = None
        self._away_until = 0.0
        self._member = instance_id or uuid.uuid4().hex
        self._positions: dict[int, int] = {}
        self._at_end: set[int] = set()
        self._skipped: list[tuple[int, int]] = []
        with broker.lock:
            self._group = broker.groups.setdefault(group_id, _Group())
            self._group.members.append(self._member)

    def _rebalance(self) -> None:
        self._lose()
        if time.monotonic() < self._away_until:
            return
        with self.broker.lock:
            members = sorted(self._group.members)
            n = len(self.broker.topics[self.topic])
            mine = {p for p in range(n) if members[p % len(members)] == self._member}
            held = set(self._positions)
            give_up = sorted(held - mine)
        if give_up:
            self._release(give_up)
        with self.broker.lock:
            owners = self._group.owners
            gained = sorted(
                p
                for p in mine - held
                if owners.get((self.topic, p)) in (None, self._member)
            )
            for p in gained:
                owners[(self.topic, p)] = self._member
            committed = {p: self._group.offsets.get((self.topic, p), 0) for p in gained}
        if gained:
            starts = self._on_assign(gained) if self._on_assign is not None else None
            for p in gained:
                start = starts.get(p) if starts is not None else None
                self._positions[p] = start if start is not None else committed[p]
                self._at_end.discard(p)

    def lose(self, seconds: float = 0.0) -> None:
        """As a Kafka member whose session expired (for tests; from any thread): at
        its next poll its partitions are lost, not handed over, and come back
        ``seconds`` later from the committed offsets (the member still in the
        group)."""
        self._lose_for = seconds

    def _lose(self) -> None:
        seconds, self._lose_for = self._lose_for, None
        if seconds is None:
            return
        self._release(sorted(self._positions), lost=True)
        self._away_until = time.monotonic() + seconds

    def _release(self, partitions: list[int], lost: bool = False) -> None:
        tell = self._on_lost if lost else self._on_revoke
        if tell is not None:
            tell(partitions)
        with self.broker.lock:
            for p in partitions:
                self._positions.pop(p, None)
                self._at_end.discard(p)
                if self._group.owners.get((self.topic, p)) == self._member:
                    del self._group.owners[(self.topic, p)]
            self.broker.lock.notify_all()

    def poll(self, timeout: float = 1.0, max_messages: int = 500) -> list[Received[T]]:
        self._rebalance()
        out = self._fetch(max_messages)
        if not out and timeout > 0:
            with self.broker.lock:
                self.broker.lock.wait(timeout)
            out = self._fetch(max_messages)
        return out

    def _fetch(self, limit: int) -> list[Received[T]]:
        out: list[Received[T]] = []
        for p in sorted(self._positions):
            records = self.broker.read(self.topic, p, self._positions[p], limit)
            if len(records) < limit:
                self._at_end.add(p)
            for rec in records:
                self._positions[p] = rec.offset + 1
                try:
                    message = self._decode(rec.value)
                except DecodeError as e:
                    self._dlq.send(rec, str(e))
                    self._skipped.append((p, rec.offset))
                    continue
                out.append(
                    Received(message, self.topic, p, rec.offset, rec.key, rec.headers)
                )
        return out

    def caught_up(self) -> bool:
        return bool(self._positions) and set(self._positions) <= self._at_end

    def drain_skipped(self) -> list[tuple[int, int]]:
        skipped, self._skipped = self._skipped, []
        return skipped

    def commit_offsets(self, offsets: Mapping[int, int]) -> bool:
        with self.broker.lock:
            owners = self._group.owners
            if any(owners.get((self.topic, p)) != self._member for p in offsets):
                return False
            for p, o in offsets.items():
                self._group.offsets[(self.topic, p)] = o
        return True

    def close(self) -> None:
        held = sorted(self._positions)
        if held:
            self._release(held)
        with self.broker.lock:
            self._group.members.remove(self._member)
            self.broker.lock.notify_all()
