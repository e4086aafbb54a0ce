"""What every ``EventLog`` adapter shares: the Avro codec, the claim check's
``restore`` (identity when payloads are not claim-checked), and sealing (the hash
chain of ``es_agents.core.chain``) for appends of plain events."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence

from es_agents.codec import AvroCodec
from es_agents.core.chain import Sealed, seal_runs
from es_agents.core.commands import Command
from es_agents.core.events import Event
from es_agents.ports import Position

_HEADS_KEPT = 100_000


class CodedLog:
    def __init__(
        self,
        codec: AvroCodec | None = None,
        restore: Callable[[Event], Event] | None = None,
    ) -> None:
        self.codec = codec if codec is not None else AvroCodec()
        self._restore: Callable[[Event], Event] = restore or (lambda event: event)
        # Heads of the runs this log appended plain events of (tools, benches,
        # tests that write whole runs); the runtime seals with the heads it loaded.
        self._heads: dict[str, bytes] = {}
        self._heads_lock = threading.Lock()

    @property
    def restore(self) -> Callable[[Event], Event]:
        return self._restore

    def encode(self, message: Event | Command) -> bytes:
        return self.codec.encode(message)

    def decode_event(self, data: bytes) -> Event:
        return self.codec.decode_event(data)

    def decode_command(self, data: bytes) -> Command:
        return self.codec.decode_command(data)

    def append(self, events: Sequence[Event]) -> list[Position]:
        """Seal plain events after the heads this log wrote, then append them."""
        with self._heads_lock:
            if len(self._heads) > _HEADS_KEPT:
                self._heads.clear()
            sealed = seal_runs(events, self.codec.encode, self._heads)
        return self.append_sealed(sealed)

    def send(self, command: Command) -> Position:
        raise NotImplementedError

    def send_all(self, commands: Sequence[Command]) -> list[Position]:
        """Several commands, one after the other (stores that can, pipeline)."""
        return [self.send(c) for c in commands]

    def append_sealed(self, records: Sequence[Sealed]) -> list[Position]:
        raise NotImplementedError

    def read_run(
        self,
        run_id: str,
        from_offset: int = 0,
        at_least: int = 0,
        restore: bool = True,
    ) -> list[Event]:
        return [
            s.event
            for s in self.read_sealed(run_id, from_offset, at_least, restore=restore)
        ]

    def read_sealed(
        self,
        run_id: str,
        from_offset: int = 0,
        at_least: int = 0,
        restore: bool = True,
        until_seq: int | None = None,
        *,
        floors: Mapping[str, int] | None = None,
    ) -> list[Sealed]:
        raise NotImplementedError
