"""What every ``EventLog`` adapter shares: the Avro codec, the claim check's
``restore`` (identity when payloads are not claim-checked), and sealing (the hash
chain of ``es_agents.core.chain``) for appends of plain events."""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from es_agents.codec import AvroCodec
from es_agents.core.authorship import Authenticator, describe, worth_a_line
from es_agents.core.chain import Sealed, seal, seal_runs
from es_agents.core.commands import Command
from es_agents.core.events import Event
from es_agents.errors import DecodeError
from es_agents.ports import Position, Record

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LeftOut:
    """A record a read left out, for audits."""

    key: str | None
    partition: int
    offset: int
    why: str


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
        # The writer key (``core.authorship``): every event appended is signed and
        # every event read verified with it; None: neither (a reader without it).
        self.auth: Authenticator | None = None
        self.forged_records = 0  # records read and left out: no valid writer MAC
        self.left_out_records: deque[LeftOut] = deque(maxlen=10_000)

    @property
    def restore(self) -> Callable[[Event], Event]:
        return self._restore

    def encode(self, message: Event | Command) -> bytes:
        return self.codec.encode(message)

    def decode_event(self, data: bytes) -> Event:
        return self.codec.decode_event(data)

    def decode_command(self, data: bytes) -> Command:
        return self.codec.decode_command(data)

    def seal(self, events: Sequence[Event], head: bytes) -> list[Sealed]:
        """One run's events chained after ``head`` and signed: ready to append."""
        return self.signed(seal(events, self.codec.encode, head))

    def signed(self, records: Sequence[Sealed]) -> list[Sealed]:
        """``records`` with the writer's MAC among their headers."""
        auth = self.auth
        if auth is None:
            return list(records)
        return [
            Sealed(r.event, r.value, (auth.header(r.value), *r.headers))
            for r in records
        ]

    def authored(
        self, record: Sealed | tuple[Sequence[tuple[str, bytes]], bytes]
    ) -> bool:
        """Whether a record read back carries a valid writer MAC (always, when this
        log has no key)."""
        if self.auth is None:
            return True
        headers, value = (
            (record.headers, record.value) if isinstance(record, Sealed) else record
        )
        return self.auth.verifies(headers, value)

    def left_out(self, record: Record, why: str | None = None) -> None:
        """Report a record a read left out: without a valid writer MAC (or, read
        without the key, undecodable). It counts as nothing: no event of its run,
        no link of its run's chain."""
        why = why or f"{describe(record.headers)}: not written by a worker"
        self.forged_records += 1
        self.left_out_records.append(
            LeftOut(record.key, record.partition, record.offset, why)
        )
        if not worth_a_line(self.forged_records):
            return
        log.warning(
            "%s[%d]@%d: left out (key %s): %s (%d so far)",
            record.topic,
            record.partition,
            record.offset,
            record.key,
            why,
            self.forged_records,
        )

    def undecodable(self, record: Record, error: DecodeError) -> None:
        """A record that does not decode: an error when it is authenticated (the
        log holds a worker's event this process cannot read: never skip it); left
        out and reported when this process has no key to tell."""
        if self.auth is not None:
            raise DecodeError(
                f"{record.topic}[{record.partition}]@{record.offset}: {error}"
            ) from error
        self.left_out(record, f"undecodable: {error}")

    def append(self, events: Sequence[Event]) -> list[Position]:
        """Seal plain events after the heads this log wrote, then append them."""
        with self._heads_lock:
            if len(self._heads) > _HEADS_KEPT:
                self._heads.clear()
            sealed = seal_runs(events, self.codec.encode, self._heads)
        return self.append_sealed(self.signed(sealed))

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
