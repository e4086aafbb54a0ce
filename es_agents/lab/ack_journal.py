"""The acknowledgement journal: what a worker saw acknowledged, one line per event.

With ``ES_AGENTS_ACK_JOURNAL=path`` a worker appends ``run_id seq event_id`` for every
event once its append returned (the broker acknowledged it, or its transaction
committed). ``bench chaos`` compares the journals with the log afterwards: a journaled
event that the log does not hold, with the same id at the same place, was lost. Lines
are written with one ``write(2)`` on an ``O_APPEND`` descriptor, so several worker
processes may share a file and a SIGKILL loses at most the lines not yet written.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

from es_agents.core.events import Event


class Acked(NamedTuple):
    run_id: str
    seq: int
    event_id: str


class AckJournal:
    def __init__(self, path: Path | None) -> None:
        self._fd = (
            os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            if path is not None
            else None
        )

    def record(self, events: Sequence[Event]) -> None:
        if self._fd is None:
            return
        lines = "".join(f"{e.run_id} {e.seq} {e.event_id}\n" for e in events)
        os.write(self._fd, lines.encode())

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_journal(path: Path) -> Iterator[Acked]:
    """Every complete line of a journal (a torn last line is skipped)."""
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1].isdigit():
            yield Acked(parts[0], int(parts[1]), parts[2])
