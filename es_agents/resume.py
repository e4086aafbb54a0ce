"""Loading a run to resume it: the latest snapshot plus at most K events.

Two honest sources for the events after the snapshot (DESIGN.md): the projection's
``run_events``, complete up to the projector's stored offset for the run's partition,
and the partition itself beyond that offset. Snapshot, events and offset are read in
one REPEATABLE READ transaction, so they agree. The tail beyond the projector's offset
is read from the partition at once: resume costs a snapshot, at most K projected
events, and the projector's lag on that partition (the events of all its runs since
the projector's last commit, usually few). ``wait_for_projector`` trades that read for
waiting until the projector reached the partition's end. Without any projection the
whole partition is folded, as the log does.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from es_agents.adapters.kafka import KafkaEventLog
from es_agents.adapters.postgres import Database
from es_agents.codec import AvroCodec
from es_agents.core.events import Event
from es_agents.core.fold import fold
from es_agents.core.snapshot import REDUCER_VERSION, from_snapshot
from es_agents.core.state import RunState

log = logging.getLogger(__name__)


def load_projected(
    conn: psycopg.Connection[Any],
    codec: AvroCodec,
    run_id: str,
    restore: Callable[[Event], Event] | None = None,
) -> tuple[RunState | None, int | None, int]:
    """The latest snapshot (of this reducer version) plus the projected events after
    it: (state, snapshot seq or None, number of events folded). O(K)."""
    row = conn.execute(
        "SELECT seq, state FROM run_snapshots WHERE run_id = %s "
        "AND reducer_version = %s ORDER BY seq DESC LIMIT 1",
        (run_id, REDUCER_VERSION),
    ).fetchone()
    state = None
    if row is not None:
        try:
            state = from_snapshot(row[1])
        except (TypeError, KeyError, ValueError) as e:
            # A snapshot is a cache of the fold: one this code cannot read (written
            # by other code under the same reducer version) is skipped, and the
            # run's projected events are folded from the start instead.
            log.warning("run %s: unreadable snapshot at seq %s (%s)", run_id, row[0], e)
            row = None
    after = row[0] if row is not None else -1
    folded = 0
    for (payload,) in conn.execute(
        "SELECT payload FROM run_events WHERE run_id = %s AND seq > %s ORDER BY seq",
        (run_id, after),
    ):
        event = codec.decode_event(bytes(payload))
        if restore is not None:
            event = restore(event)
        state = fold(state if state is not None else RunState(run_id=run_id), event)
        folded += 1
    return state, (row[0] if row is not None else None), folded


@dataclass(frozen=True)
class Loaded:
    state: RunState | None
    snapshot_seq: int | None  # None: no snapshot was used
    events_from_db: int
    events_from_log: int


class RunLoader:
    def __init__(
        self,
        db: Database,
        log: KafkaEventLog,
        group_id: str,
        wait_for_projector: float = 0.0,
    ) -> None:
        self.db = db
        self.log = log
        self.group_id = group_id
        self.wait = wait_for_projector

    def projected_until(self, partition: int) -> int:
        with self.db.transaction() as conn:
            row = conn.execute(
                "SELECT next_offset FROM projector_offsets WHERE group_id = %s "
                "AND topic = %s AND partition = %s",
                (self.group_id, self.log.settings.events_topic, partition),
            ).fetchone()
        return int(row[0]) if row is not None else 0

    def load(self, run_id: str, at_least: int = 0, restore: bool = True) -> Loaded:
        """``at_least``: the caller's own last committed offset on the run's
        partition; the tail is read at least that far (read your writes).
        ``restore``: read claim-checked payloads back (False: leave them claimed,
        to learn a run's position when a payload is unavailable)."""
        partition = self.log.partition_for(run_id)
        if self.wait > 0:
            end = self.log.end_offset(self.log.settings.events_topic, partition)
            deadline = time.monotonic() + self.wait
            while self.projected_until(partition) < end:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.01)
        codec = self.log.codec
        with self.db.transaction() as conn:
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            state, snapshot_seq, from_db = load_projected(
                conn, codec, run_id, self.log.restore if restore else None
            )
            offset_row = conn.execute(
                "SELECT next_offset FROM projector_offsets WHERE group_id = %s "
                "AND topic = %s AND partition = %s",
                (self.group_id, self.log.settings.events_topic, partition),
            ).fetchone()
        projected = int(offset_row[0]) if offset_row is not None else 0
        tail = 0
        for event in self.log.read_run(
            run_id, from_offset=projected, at_least=at_least, restore=restore
        ):
            if state is None or event.seq > state.seq:
                state = fold(
                    state if state is not None else RunState(run_id=run_id), event
                )
                tail += 1
        return Loaded(state, snapshot_seq, from_db, tail)
