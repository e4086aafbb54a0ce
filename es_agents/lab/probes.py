"""The lab's probe: crash points and the acknowledgement journal in one ``Probe``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from es_agents.core.events import Event
from es_agents.lab.ack_journal import AckJournal
from es_agents.lab.crash import CrashPoints


class LabProbe:
    def __init__(self, crash: CrashPoints, journal: Path | None) -> None:
        self._crash = crash
        self._journal = AckJournal(journal)

    def hit(self, point: str) -> None:
        self._crash.hit(point)

    def acked(self, events: Sequence[Event]) -> None:
        self._journal.record(events)

    def close(self) -> None:
        self._journal.close()
