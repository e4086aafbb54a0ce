"""``PREFIX.dlq``: records that cannot be decoded or applied, with the reason.

The original key and bytes are kept; the reason and where the record was read go in
headers. A dead letter is durable before the reader moves past its record, so nothing
is lost and nothing stalls a partition. Works on any ``EventLog``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime

from es_agents.observability import NoTelemetry, Telemetry
from es_agents.ports import EventLog, Position, Record

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DeadLetter:
    """One record of the DLQ: where it sits, its run (the key), why it is there,
    and where it was read from."""

    partition: int
    offset: int
    run_id: str
    reason: str
    origin: str  # topic[partition]@offset
    at: str
    size: int


def read_dead_letters(
    log: EventLog, topic: str, run_id: str | None = None, limit: int = 100
) -> list[DeadLetter]:
    """The DLQ's records (of one run when given), the latest ``limit`` of them."""
    found: list[DeadLetter] = []
    for partition in range(log.partition_count()):
        if run_id is not None and partition != log.partition_for(run_id):
            continue
        for record in log.read_partition(topic, partition):
            if run_id is not None and record.key != run_id:
                continue
            h = {k: v.decode(errors="replace") for k, v in record.headers}
            found.append(
                DeadLetter(
                    partition=partition,
                    offset=record.offset,
                    run_id=record.key or "",
                    reason=h.get("es.dlq.reason", ""),
                    origin=f"{h.get('es.dlq.topic', '?')}"
                    f"[{h.get('es.dlq.partition', '?')}]@{h.get('es.dlq.offset', '?')}",
                    at=h.get("es.dlq.at", ""),
                    size=len(record.value),
                )
            )
    found.sort(key=lambda d: d.at)
    return found[-limit:]


class DeadLetterQueue:
    def __init__(
        self, log: EventLog, topic: str, telemetry: Telemetry | None = None
    ) -> None:
        self.topic = topic
        self._log = log
        self._telemetry = telemetry if telemetry is not None else NoTelemetry()

    def send(self, record: Record, reason: str) -> Position:
        return self.send_command(
            record.key or "",
            record.value,
            Position(record.topic, record.partition, record.offset),
            reason,
        )

    def send_command(
        self, key: str, value: bytes, origin: Position, reason: str
    ) -> Position:
        """Dead-letter ``value`` (read at ``origin``) with the reason; durable."""
        headers = (
            ("es.dlq.reason", reason.encode()),
            ("es.dlq.topic", origin.topic.encode()),
            ("es.dlq.partition", str(origin.partition).encode()),
            ("es.dlq.offset", str(origin.offset).encode()),
            ("es.dlq.at", datetime.now(UTC).isoformat().encode()),
        )
        position = self._log.produce(self.topic, key, value, headers)
        self._telemetry.dead_letter(origin.topic)
        log.warning(
            "dead-lettered %s[%d]@%d to %s@%d: %s",
            origin.topic,
            origin.partition,
            origin.offset,
            self.topic,
            position.offset,
            reason,
        )
        return position
