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

from collections.abc import Mapping

from es_agents.archive import Written
from es_agents.core.authorship import AUTH_HEADER
from es_agents.errors import ProjectionIncomplete
from es_agents.ports import EventLog, Record


def read_projected(
    log: EventLog, topic: str, run_id: str, where: Mapping[int, int]
) -> list[Written]:
    """The run's projected events, in order, from the log: ``where`` maps each
    one's offset to its seq (``Projections.positions``). ``ProjectionIncomplete``
    when the log lacks one of them."""
    if not where:
        return []
    partition = log.partition_for(run_id)
    last = max(where)
    found: list[Written] = []
    records = log.read_partition(topic, partition, min(where))
    try:
        for record in records:
            seq = where.get(record.offset)
            if seq is not None and record.key == run_id:
                found.append(
                    Written(seq, partition, record.offset, record.value, _mac(record))
                )
            if record.offset >= last:
                break
    finally:
        close = getattr(records, "close", None)
        if close is not None:  # release the reader now (a generator holds a lock)
            close()
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
