"""Loading a run to resume it: the latest snapshot plus at most K events.

Two honest sources for the events after the snapshot: the projection's
events, complete up to the projector's stored offset for the run's partition, and the
partition itself beyond that offset. The projection port reads snapshot, events and
offset together, so they agree. The tail beyond the projector's offset is read from
the log at once: resume costs a snapshot, at most K projected events, and the
projector's lag on that partition. ``wait_for_projector`` trades that read for waiting
until the projector reached the partition's end. Without any projection the run's
whole log is folded.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass

from es_agents.core.chain import GENESIS, Sealed
from es_agents.core.events import Event
from es_agents.core.fold import fold
from es_agents.core.state import RunState
from es_agents.errors import ProjectionIncomplete, ProjectionUntrusted
from es_agents.history import read_projected
from es_agents.ports import EventLog, Projected, Projections

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Loaded:
    state: RunState | None
    snapshot_seq: int | None  # None: no snapshot was used
    events_from_db: int
    events_from_log: int
    head: bytes = GENESIS  # digest of the last event's bytes: the next event's prev
    archived: str | None = None  # a finished run's archive, its rows purged


class RunLoader:
    def __init__(
        self,
        projections: Projections,
        log: EventLog,
        events_topic: str,
        wait_for_projector: float = 0.0,
    ) -> None:
        self.projections = projections
        self.log = log
        self.events_topic = events_topic
        self.wait = wait_for_projector

    def projected_until(self, partition: int) -> int:
        return self.projections.projected_until(partition)

    def _decoded(self, value: bytes, restore: bool) -> Event:
        event = self.log.decode_event(value)
        return self.log.restore(event) if restore else event

    def load(self, run_id: str, at_least: int = 0, restore: bool = True) -> Loaded:
        """``at_least``: the caller's own last committed offset on the run's
        partition; the tail is read at least that far (read your writes).
        ``restore``: read claim-checked payloads back (False: leave them claimed,
        to learn a run's position when a payload is unavailable)."""
        partition = self.log.partition_for(run_id)
        if self.wait > 0:
            end = self.log.end_offset(self.events_topic, partition)
            deadline = time.monotonic() + self.wait
            while self.projected_until(partition) < end:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.01)
        try:
            projected = self.projections.load(
                run_id, partition, self.log.restore if restore else None
            )
            history: list[Sealed] = []
        except ProjectionUntrusted as e:
            # Rows changed by someone without the writer key: the log decides.
            first = self.projections.first_offset(run_id)
            log.warning("%s: resumed from the log from offset %s", e, first or 0)
            projected = Projected(None, None, 0, first or 0)
            history = []
        except ProjectionIncomplete as e:
            # No snapshot to start from (another reducer version's, or one not
            # usable): the projected events are read from the log.
            log.info("%s: its projected events are read from the log", e)
            where = self.projections.positions(run_id, partition)
            history = [
                Sealed(self._decoded(w.value, restore), w.value)
                for w in read_projected(
                    self.log, self.events_topic, run_id, where.offsets
                )
            ]
            projected = Projected(
                None, None, 0, where.projected_until, floors=where.floors
            )
        state = projected.state
        head = projected.head
        tail = 0
        for sealed in itertools.chain(
            history,
            self.log.read_sealed(
                run_id,
                from_offset=projected.projected_until,
                at_least=at_least,
                restore=restore,
                floors=projected.floors,
            ),
        ):
            event = sealed.event
            if state is None or event.seq > state.seq:
                if event.prev != head or event.run_id != run_id:
                    # Not the next link of this run's chain: a copy of another
                    # run's event or a record out of place. It counts as nothing.
                    log.warning(
                        "run %s: seq %d left out: it does not chain on the run's "
                        "head %s",
                        run_id,
                        event.seq,
                        head.hex()[:12] or "(genesis)",
                    )
                    continue
                state = fold(
                    state if state is not None else RunState(run_id=run_id), event
                )
                head = sealed.digest
                tail += 1
        return Loaded(
            state,
            projected.snapshot_seq,
            projected.events,
            tail,
            head,
            projected.archived if state is None else None,
        )
