"""The roles the runtime needs from the outside world, as small Protocols."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from es_agents.core.commands import Command
from es_agents.core.events import Event


@dataclass(frozen=True, slots=True)
class Position:
    """Where a record landed: the broker's acknowledgement."""

    topic: str
    partition: int
    offset: int


class EventLog(Protocol):
    """The append-only log of every run's events."""

    def append(self, events: Sequence[Event]) -> list[Position]:
        """Return only after every event is durable, in order; raise otherwise."""
        ...

    def read_run(self, run_id: str, from_offset: int = 0) -> list[Event]:
        """The run's events in order, from a partition offset to the current end."""
        ...

    def partition_for(self, run_id: str) -> int: ...


class CommandBus(Protocol):
    """Where people and scripts send commands to runs."""

    def send(self, command: Command) -> Position: ...


class BlobStore(Protocol):
    """Content-addressed bytes for payloads too large for an event (claim check)."""

    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key``; storing the same key again is harmless."""
        ...

    def get(self, key: str) -> bytes:
        """The bytes under ``key``; raise ``PayloadUnavailable`` when missing."""
        ...
