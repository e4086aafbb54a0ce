"""``PREFIX.dlq``: records that cannot be decoded or applied, with the reason.

The original key and bytes are kept; the reason and where the record was read go in
headers. A dead letter is durable before the reader moves past its record, so nothing
is lost and nothing stalls a partition. Works on any ``EventLog``.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from es_agents.ports import EventLog, Position, Record

log = logging.getLogger(__name__)


class DeadLetterQueue:
    def __init__(self, log: EventLog, topic: str) -> None:
        self.topic = topic
        self._log = log

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
