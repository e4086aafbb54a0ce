"""What every ``EventLog`` adapter shares: the Avro codec and the claim check's
``restore`` (identity when payloads are not claim-checked)."""

from __future__ import annotations

from collections.abc import Callable

from es_agents.codec import AvroCodec
from es_agents.core.commands import Command
from es_agents.core.events import Event


class CodedLog:
    def __init__(
        self,
        codec: AvroCodec | None = None,
        restore: Callable[[Event], Event] | None = None,
    ) -> None:
        self.codec = codec if codec is not None else AvroCodec()
        self._restore: Callable[[Event], Event] = restore or (lambda event: event)

    @property
    def restore(self) -> Callable[[Event], Event]:
        return self._restore

    def encode(self, message: Event | Command) -> bytes:
        return self.codec.encode(message)

    def decode_event(self, data: bytes) -> Event:
        return self.codec.decode_event(data)

    def decode_command(self, data: bytes) -> Command:
        return self.codec.decode_command(data)
