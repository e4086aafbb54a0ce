"""A run's history read back from the log.

The projection does not repeat the log: ``run_events`` says where each projected
event of a run is (its partition and offset), and keeps the bytes only of what a
resume folds (``run_tails``: the events from the run's latest snapshot on). Whoever
needs a whole run -- ``show`` and the UI, ``upgrade check``, an archive, a resume
without a snapshot of its reducer version -- reads the events at those offsets from
the log, which is the system of record, in one pass over the stretch of the
partition they span. Only the events the projector took are read: a fenced
worker's write or a record no worker wrote, which the projector left out, has no
row and is not read.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping

from es_agents.archive import Written
from es_agents.core.authorship import AUTH_HEADER
from es_agents.core.events import Event
from es_agents.errors import DecodeError, ProjectionIncomplete
from es_agents.ports import EventLog, Positions, Record

log = logging.getLogger(__name__)


def read_runs(
    log_: EventLog, topic: str, where: Mapping[str, Positions]
) -> dict[str, list[Event]]:
    """Several runs' events as they count, in order: their projected events
    (``where``: each run's ``Projections.positions``) and, beyond the projector,
    the events the log holds for them, claim-checked payloads left claimed. Two
    reads per partition, whatever the number of runs: one over the stretch their
    projected events span, one from the projector's offset (with its epoch floors
    there) to the end. A run whose projected events are not all in this log (a
    run of another topic prefix sharing the database, or a log that lost them) is
    left out of the answer, and logged."""
    found: dict[str, dict[int, Event]] = {run_id: {} for run_id in where}
    by_partition: dict[int, dict[str, Positions]] = {}
    for run_id, positions in where.items():
        by_partition.setdefault(log_.partition_for(run_id), {})[run_id] = positions
    for partition, runs in by_partition.items():
        _read_projected(log_, topic, partition, runs, found)
        if not runs:
            continue
        # Beyond the projector: from the earliest offset any of them was read at,
        # with the floors there (a later event read twice counts once, by seq).
        first = min(runs.values(), key=lambda p: p.projected_until)
        records = log_.read_partition(
            topic, partition, first.projected_until, floors=first.floors
        )
        for record in records:
            if record.key in runs:
                try:
                    event = log_.decode_event(record.value)
                except DecodeError:
                    continue  # reported where the log is read for acting
                found[record.key].setdefault(event.seq, event)
    return {
        run_id: [e for _, e in sorted(seqs.items())] for run_id, seqs in found.items()
    }


def _read_projected(
    log_: EventLog,
    topic: str,
    partition: int,
    runs: dict[str, Positions],
    found: dict[str, dict[int, Event]],
) -> None:
    """Into ``found``, the projected events of ``runs`` (all on ``partition``),
    read in one pass; a run not all there is dropped from ``runs`` and ``found``."""
    wanted: dict[int, dict[str, int]] = {}  # offset -> run -> seq
    for run_id, positions in runs.items():
        for offset, seq in positions.offsets.items():
            wanted.setdefault(offset, {})[run_id] = seq
    if not wanted:
        return
    for record in _stretch(log_, topic, partition, min(wanted), max(wanted)):
        at = wanted.get(record.offset, {}).get(record.key or "")
        if at is not None and record.key is not None:
            found[record.key][at] = log_.decode_event(record.value)
    for run_id, positions in list(runs.items()):
        if len(found[run_id]) != len(positions.offsets):
            log.warning(
                "run %s: %d of its %d projected events are not in %s[%d]",
                run_id,
                len(positions.offsets) - len(found[run_id]),
                len(positions.offsets),
                topic,
                partition,
            )
            del found[run_id], runs[run_id]


def _stretch(
    log_: EventLog, topic: str, partition: int, start: int, last: int
) -> Iterator[Record]:
    """The partition's records from ``start`` to ``last``, the reader released
    as soon as ``last`` is read."""
    records = log_.read_partition(topic, partition, start)
    try:
        for record in records:
            yield record
            if record.offset >= last:
                return
    finally:
        close = getattr(records, "close", None)
        if close is not None:  # a generator holding the reader's lock
            close()


def read_projected(
    log_: EventLog, topic: str, run_id: str, where: Mapping[int, int]
) -> list[Written]:
    """The run's projected events, in order, from the log: ``where`` maps each
    one's offset to its seq (``Projections.positions``). ``ProjectionIncomplete``
    when the log lacks one of them."""
    if not where:
        return []
    partition = log_.partition_for(run_id)
    found: list[Written] = []
    for record in _stretch(log_, topic, partition, min(where), max(where)):
        seq = where.get(record.offset)
        if seq is not None and record.key == run_id:
            found.append(
                Written(seq, partition, record.offset, record.value, _mac(record))
            )
    if len(found) != len(where):
        have = {w.offset for w in found}
        lost = sorted(set(where) - have)
        raise ProjectionIncomplete(
            f"run {run_id}: {len(lost)} projected events are not in the log at "
            f"{topic}[{partition}] (offsets {', '.join(map(str, lost[:5]))})"
        )
    found.sort(key=lambda w: w.seq)
    return found


def _mac(record: Record) -> str | None:
    for name, value in record.headers:
        if name == AUTH_HEADER:
            return value.decode()
    return None
