"""Which commands' offsets may be committed: only those applied, in order."""

from __future__ import annotations

import threading
from collections.abc import Sequence


class OffsetTracker:
    """Commit a command's offset only when it and every earlier one were applied."""

    def __init__(self) -> None:
        self._pending: dict[int, set[int]] = {}
        self._seen: dict[int, int] = {}
        self._committed: dict[int, int] = {}
        self._lock = threading.Lock()

    def begin(self, partition: int, offset: int) -> None:
        with self._lock:
            self._pending.setdefault(partition, set()).add(offset)
            self._seen[partition] = max(self._seen.get(partition, -1), offset)

    def done(self, partition: int, offset: int) -> None:
        with self._lock:
            self._pending.get(partition, set()).discard(offset)

    def forget(self, partitions: Sequence[int]) -> None:
        with self._lock:
            for p in partitions:
                self._pending.pop(p, None)
                self._seen.pop(p, None)
                self._committed.pop(p, None)

    def to_commit(self) -> dict[int, int]:
        """Next offsets to commit, for partitions that moved since the last commit."""
        out: dict[int, int] = {}
        with self._lock:
            for p, seen in self._seen.items():
                pending = self._pending.get(p)
                next_offset = min(pending) if pending else seen + 1
                if next_offset > self._committed.get(p, -1):
                    out[p] = next_offset
        return out

    def committed(self, offsets: dict[int, int]) -> None:
        with self._lock:
            self._committed.update(offsets)

    @property
    def in_flight(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._pending.values())
