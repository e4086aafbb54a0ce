"""A finished run's archive: its events in one Avro object container file.

The file is readable with fastavro alone (``fastavro.reader``), without es-agents
or its schemas. Each record is one event, in order:

- ``seq``, ``type``, ``event_id``, ``at`` (UTC milliseconds), ``partition`` and
  ``offset`` (where the log holds it);
- ``event``: the event as JSON, every field named (``prev`` in hex);
- ``written``: the record's bytes exactly as the log holds them (schema header and
  Avro body), which the run's hash chain covers: each event's ``prev`` is the
  SHA-256 of the previous ``written``; ``mac``, the writer's signature of them;
- ``payloads``: the objects its claim-checked fields name (key and bytes, as the
  object store held them -- sealed, for a run whose payloads are encrypted), so the
  archive stands alone once the run's objects are deleted.

The file's metadata names the run (``es_agents.run_id``), the topic prefix, the
number of events, the last event's digest (``es_agents.head``) and, for every
writer schema the events use, its text under its fingerprint
(``es_agents.schemas``): ``written`` decodes with fastavro too, past its 10-byte
header. ``check`` verifies an archive as ``audit`` does: the sequence from 0, the
chain, each ``event`` the decoding of its ``written``.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import fastavro

from es_agents.codec import AvroCodec
from es_agents.core.chain import GENESIS, digest
from es_agents.core.events import Event
from es_agents.errors import DecodeError, PayloadUnavailable

SCHEMA = fastavro.parse_schema(
    {
        "type": "record",
        "name": "ArchivedEvent",
        "namespace": "es_agents.archive",
        "doc": "One event of a finished run, as the log held it.",
        "fields": [
            {"name": "seq", "type": "long"},
            {"name": "type", "type": "string"},
            {"name": "event_id", "type": "string"},
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "partition", "type": "int"},
            {"name": "offset", "type": "long"},
            {"name": "event", "type": "string", "doc": "the event as JSON"},
            {"name": "written", "type": "bytes", "doc": "the log record's bytes"},
            {
                "name": "mac",
                "type": ["null", "string"],
                "default": None,
                "doc": "the writer's signature of the bytes, as the log's header",
            },
            {
                "name": "payloads",
                "type": {
                    "type": "array",
                    "items": {
                        "type": "record",
                        "name": "Payload",
                        "fields": [
                            {"name": "key", "type": "string"},
                            {"name": "data", "type": "bytes"},
                        ],
                    },
                },
                "default": [],
                "doc": "the objects its claim-checked fields name",
            },
        ],
    }
)


@dataclass(frozen=True)
class Written:
    """One event as the projection holds it: its log position and its bytes."""

    seq: int
    partition: int
    offset: int
    value: bytes
    mac: str | None = None  # the writer's signature of ``value`` (authorship)


def key_of(topic_prefix: str, run_id: str) -> str:
    """The archive's object key: beside the payloads, by prefix and run."""
    return f"archive/{topic_prefix}/{run_id}.avro"


def event_json(event: Event) -> str:
    """The event as JSON: bytes (the chain's ``prev``) as hex, times as ISO 8601."""

    def plain(value: object) -> str:
        if isinstance(value, bytes):
            return value.hex()
        if isinstance(value, datetime):
            return value.isoformat()
        raise TypeError(f"{type(value).__name__} is not JSON")

    return json.dumps(event.model_dump(mode="python"), default=plain, sort_keys=True)


def claimed_keys(event: Event) -> list[str]:
    return [claim.key for claim in getattr(event, "claims", ())]


def write(
    run_id: str,
    topic_prefix: str,
    rows: Sequence[Written],
    codec: AvroCodec,
    fetch: Callable[[str], bytes],
) -> bytes:
    """The archive of ``run_id``'s events (``rows``, in order) as file bytes;
    ``fetch`` reads a claimed payload object (``PayloadUnavailable`` when missing:
    no archive is written without every payload)."""
    schemas: dict[str, str] = {}
    records = []
    for row in rows:
        info, _ = codec.writer_of(row.value)
        schemas[info.fingerprint.hex()] = info.text
        event = codec.decode_event(row.value)
        records.append(
            {
                "seq": row.seq,
                "type": event.wire_name,
                "event_id": event.event_id,
                "at": event.at,
                "partition": row.partition,
                "offset": row.offset,
                "event": event_json(event),
                "written": row.value,
                "mac": row.mac,
                "payloads": [
                    {"key": key, "data": fetch(key)} for key in claimed_keys(event)
                ],
            }
        )
    head = digest(rows[-1].value).hex() if rows else ""
    out = io.BytesIO()
    fastavro.writer(
        out,
        SCHEMA,
        records,
        codec="deflate",
        # The same events make the same bytes: two workers archiving one run at
        # once write one object (the sync marker is otherwise random).
        sync_marker=hashlib.sha256(f"{run_id}\0{head}".encode()).digest()[:16],
        metadata={
            "es_agents.run_id": run_id,
            "es_agents.topic_prefix": topic_prefix,
            "es_agents.events": str(len(rows)),
            "es_agents.head": head,
            "es_agents.schemas": json.dumps(schemas, sort_keys=True),
        },
    )
    return out.getvalue()


@dataclass(frozen=True)
class Archive:
    run_id: str
    topic_prefix: str
    head: str
    records: list[dict[str, Any]]

    def written(self) -> list[Written]:
        return [
            Written(r["seq"], r["partition"], r["offset"], r["written"], r["mac"])
            for r in self.records
        ]

    def payloads(self) -> dict[str, bytes]:
        return {p["key"]: p["data"] for r in self.records for p in r["payloads"]}


@dataclass(frozen=True)
class Kept:
    """The payload objects an archive holds, as a ``BlobStore`` to read from."""

    objects: dict[str, bytes]

    def put(self, key: str, data: bytes) -> None:
        self.objects[key] = data

    def get(self, key: str) -> bytes:
        data = self.objects.get(key)
        if data is None:
            raise PayloadUnavailable(f"{key}: not in the archive")
        return data

    def delete(self, key: str) -> None:
        self.objects.pop(key, None)

    def written_at(self, key: str) -> datetime | None:
        return None  # written with the archive


def read(data: bytes) -> Archive:
    """An archive's records and metadata; ``DecodeError`` when it is not one."""
    try:
        reader = fastavro.reader(io.BytesIO(data))
        records = [dict(r) for r in reader]  # type: ignore[arg-type]
        meta = reader.metadata
    except (ValueError, EOFError, TypeError, KeyError) as e:
        raise DecodeError(f"not an archive: {e}") from e
    return Archive(
        meta.get("es_agents.run_id", ""),
        meta.get("es_agents.topic_prefix", ""),
        meta.get("es_agents.head", ""),
        records,
    )


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check(
    archive: Archive,
    decode: Callable[[bytes], Event],
    last_seq: int | None = None,
) -> list[str]:
    """What is wrong with an archive (nothing: an empty list): the run's events
    from seq 0 (to ``last_seq`` when given), each chained to the one before, each
    ``event`` the decoding of its ``written``, the head the last one's digest."""
    problems: list[str] = []
    head = GENESIS
    for n, record in enumerate(archive.records):
        where = f"{archive.run_id} seq {record.get('seq')}"
        if record["seq"] != n:
            problems.append(f"{where}: expected seq {n}")
        try:
            event = decode(record["written"])
        except DecodeError as e:
            problems.append(f"{where}: its bytes do not decode: {e}")
            continue
        if event.run_id != archive.run_id or event.seq != record["seq"]:
            problems.append(f"{where}: its bytes are {event.run_id} seq {event.seq}")
        if event.prev != head:
            problems.append(f"{where}: does not chain on the event before it")
        if json.loads(record["event"]) != json.loads(event_json(event)):
            problems.append(f"{where}: its JSON is not what its bytes say")
        kept = {p["key"]: p["data"] for p in record["payloads"]}
        for claim in getattr(event, "claims", ()):
            data = kept.get(claim.key)
            if data is None or hashlib.sha256(data).hexdigest() != claim.sha256:
                problems.append(f"{where}: payload {claim.key} missing or altered")
        head = digest(record["written"])
    if archive.records and head.hex() != archive.head:
        problems.append(f"{archive.run_id}: the head is not the last event's digest")
    if last_seq is not None and len(archive.records) != last_seq + 1:
        problems.append(
            f"{archive.run_id}: {len(archive.records)} events, the run has "
            f"{last_seq + 1}"
        )
    return problems
