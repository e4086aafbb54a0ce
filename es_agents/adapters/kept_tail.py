"""The records of one partition from an offset to the end last read, kept by key.

A worker loads a run from its projection and then reads the run's partition from the
projector's position to the end: the events the projector has not written yet. Under
load many runs of a partition are loaded within moments, and each such read went over
the same stretch of the log. Kept, the stretch is read once: the next load reads only
what came after it and takes its run's records (and the keyless claims the fence
needs) from here, and loads that waited while another read the partition to its end
share that read (the end it found is the end at a moment after they asked). The log
is append-only and read as committed, so what was read stays true; the stretch is
dropped below the offset the loads start at, and given up when it grows past
``limit`` records (a projector far behind: reads go to the log).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Iterator
from typing import final

from es_agents.ports import Record


@final
class KeptTail:
    """Records of offsets ``start`` to ``end`` (exclusive), by key."""

    __slots__ = ("_all", "_by_key", "end", "limit", "read_at", "start")

    def __init__(self, start: int, limit: int = 50_000) -> None:
        self.start = start
        self.end = start
        self.read_at = float("-inf")  # when the read that reached ``end`` began
        self.limit = limit
        self._all: list[Record] = []  # in offset order
        self._by_key: dict[str | None, list[Record]] = {}

    def covers(self, start: int) -> bool:
        return self.start <= start

    @property
    def count(self) -> int:
        return len(self._all)

    @property
    def full(self) -> bool:
        return len(self._all) > self.limit

    def add(self, record: Record) -> None:
        """A record read past ``end`` (in offset order)."""
        self._all.append(record)
        self._by_key.setdefault(record.key, []).append(record)

    def read_to(self, end: int, began: float) -> None:
        """A read that began at ``began`` (monotonic) found the end at ``end``."""
        self.end = max(self.end, end)
        self.read_at = max(self.read_at, began)

    def current_for(self, asked: float, at_least: int) -> bool:
        """Whether a read asked for at ``asked`` finds nothing more in the log than
        is kept: a read to the end began after it was asked, and reached
        ``at_least``. Loads queued behind one read of the partition share it."""
        return self.read_at >= asked and self.end >= at_least

    def drop_below(self, start: int) -> None:
        """Forget the records below ``start`` (loads start there now) once they are
        half of what is kept: the lists are rebuilt then, not at every load."""
        below = _first_at(self._all, start)
        if below * 2 <= len(self._all) or below == 0:
            return
        self.start = start
        self._all = self._all[below:]
        self._by_key = {}
        for record in self._all:
            self._by_key.setdefault(record.key, []).append(record)

    def of(self, key: str, start: int) -> Iterator[Record]:
        """``key``'s records and the keyless ones from ``start``, in offset order."""
        own = self._by_key.get(key, [])
        keyless = self._by_key.get(None, [])
        return heapq.merge(
            own[_first_at(own, start) :],
            keyless[_first_at(keyless, start) :],
            key=_offset,
        )


def _offset(record: Record) -> int:
    return record.offset


def _first_at(records: list[Record], start: int) -> int:
    return bisect_left(records, start, key=_offset)
