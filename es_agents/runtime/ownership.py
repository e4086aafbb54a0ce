"""Partition ownership: the fencing token and the fenced writer of each partition
this worker owns, and which runs to resume when it gains one.

On assignment the worker takes the partition's next epoch (its fencing token, passed
to tools) and builds the store's fenced writer for it, driven by the partition's
driver (``driver``: group commit); the writer of a previous owner is fenced from then
on. On revocation the writers close, so a loop still running for that partition can
append nothing more.

A partition *lost* rather than handed over (the group session expired, as while the
group coordinator's broker is down) is held: its writer stays open and its runs go
on, every append still fenced by the epoch. When the group gives it back and the
epoch store still names this worker's epoch -- nobody claimed it meanwhile -- it is
kept as it was: no new claim, no reload. Otherwise, or when the hold runs out, it is
let go as on a revocation.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence

from es_agents.core.chain import Sealed
from es_agents.core.fold import fold
from es_agents.core.state import RunState
from es_agents.errors import DecodeError, EsAgentsError, FencedError
from es_agents.ports import EventLog, Projections, WriterFactory
from es_agents.runtime.driver import PartitionDriver

log = logging.getLogger(__name__)


class Ownership:
    def __init__(
        self, group: str, projections: Projections, make_writer: WriterFactory
    ) -> None:
        self.group = group
        self._projections = projections
        self._make_writer = make_writer
        self._lock = threading.Lock()
        self._drivers: dict[int, PartitionDriver] = {}
        self._epochs: dict[int, int] = {}
        self._held: dict[int, float] = {}  # lost partitions: until when (monotonic)

    def assign(self, partitions: Iterable[int]) -> None:
        for partition in partitions:

            def take_epoch(partition: int = partition) -> int:
                return self._projections.next_epoch(self.group, partition)

            writer = self._make_writer(self.group, partition, take_epoch)  # fences
            with self._lock:
                old = self._drivers.pop(partition, None)
                self._epochs[partition] = writer.epoch
                self._drivers[partition] = PartitionDriver(writer, partition)
            if old is not None:  # assigned again without a revoke: a new epoch
                old.close()

    def hold(self, partitions: Iterable[int], until: float) -> None:
        """Keep the writers of lost partitions open until ``until`` (monotonic)."""
        with self._lock:
            for partition in partitions:
                if partition in self._drivers:
                    self._held[partition] = until

    def held_out(self, now: float) -> list[int]:
        """The held partitions whose hold ran out (no longer held): to let go."""
        with self._lock:
            out = sorted(p for p, until in self._held.items() if until <= now)
            for partition in out:
                del self._held[partition]
        return out

    def take_back(self, partitions: Iterable[int]) -> tuple[list[int], list[int]]:
        """Of partitions assigned again, those held: ``(kept, stale)``. Kept: the
        epoch store still names this worker's epoch (nobody claimed the partition
        meanwhile), so its writer and runs go on. Stale: claimed by another worker
        meanwhile (or the store could not tell): to let go before a new claim."""
        kept: list[int] = []
        stale: list[int] = []
        for partition in partitions:
            with self._lock:
                held = self._held.pop(partition, None) is not None
                epoch = self._epochs.get(partition)
            if not held:
                continue
            try:
                now = self._projections.current_epoch(self.group, partition)
            except EsAgentsError as e:
                log.warning(
                    "partition %d: its epoch unknown (%s): claimed again", partition, e
                )
                now = None
            (kept if now is not None and now == epoch else stale).append(partition)
        return kept, stale

    def revoke(self, partitions: Iterable[int]) -> None:
        with self._lock:
            drivers = [self._drivers.pop(p) for p in partitions if p in self._drivers]
            for partition in partitions:
                self._epochs.pop(partition, None)
                self._held.pop(partition, None)
        for driver in drivers:
            driver.close()

    def close(self) -> None:
        with self._lock:
            partitions = list(self._drivers)
        self.revoke(partitions)

    def driver(self, partition: int) -> PartitionDriver:
        with self._lock:
            driver = self._drivers.get(partition)
        if driver is None:
            raise FencedError(f"partition {partition} is not owned by this worker")
        return driver

    def epoch(self, partition: int) -> int:
        epoch = self.current_epoch(partition)
        if epoch is None:
            raise FencedError(f"partition {partition} is not owned by this worker")
        return epoch

    def current_epoch(self, partition: int) -> int | None:
        with self._lock:
            return self._epochs.get(partition)

    def committed_end(self, partition: int) -> int:
        """The offset after this worker's last append on the partition (0: none)."""
        with self._lock:
            driver = self._drivers.get(partition)
        return driver.committed_end if driver is not None else 0


def runs_to_resume(
    log_: EventLog,
    projections: Projections,
    events_topic: str,
    partition: int,
    agent: str,
) -> list[str]:
    """The runs of ``agent`` that were running when the partition was last owned.

    With a projection: the runs the projection says are running, plus every run with
    events past the projector's offset (each loads in O(K) and stops at once if it is
    not running). Without one: fold the whole partition.
    """
    projected = projections.projected_until(partition)
    if projected > 0:
        candidates = projections.running(partition, agent)
        for record in log_.read_partition(events_topic, partition, projected):
            if record.key is not None:
                candidates.add(record.key)
        return sorted(candidates)
    states: dict[str, RunState] = {}
    for record in log_.read_partition(events_topic, partition):
        try:
            event = log_.decode_event(record.value)
        except DecodeError as e:
            log.error(  # noqa: TRY400 - the reason is in the message
                "%s[%d]: skipping undecodable event: %s", events_topic, partition, e
            )
            continue
        state = states.get(event.run_id)
        if state is None:
            state = states[event.run_id] = RunState(run_id=event.run_id)
        try:
            fold(state, event)
        except EsAgentsError as e:
            log.error(  # noqa: TRY400 - the reason is in the message
                "%s[%d]: run %s does not fold: %s",
                events_topic,
                partition,
                event.run_id,
                e,
            )
            state.status = "failed"  # quarantined when a command comes
    return [
        s.run_id
        for s in states.values()
        if s.status in ("running", "blocked") and s.agent == agent
    ]


class LogWriter:
    """Unfenced appends straight to the log (``ES_AGENTS_FENCING=none``); the epoch
    is still taken, as the fencing token tools get."""

    def __init__(self, log_: EventLog, epoch: int) -> None:
        self._log = log_
        self.epoch = epoch
        self.committed_end = 0

    def append(self, records: Sequence[Sealed]) -> None:
        positions = self._log.append_sealed(records)
        if positions:
            self.committed_end = max(self.committed_end, positions[-1].offset + 1)

    def close(self) -> None:
        pass
