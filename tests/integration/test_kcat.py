"""A third-party client reads es.events, and the bytes decode with fastavro and the
files in schemas/ alone: no es-agents code on the reading side."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Any

import fastavro
import pytest
from fastavro.schema import fingerprint, to_parsing_canonical_form

from es_agents.adapters.kafka import KafkaEventLog
from es_agents.lab.demo import script
from es_agents.settings import KafkaSettings

pytestmark = pytest.mark.integration
SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


def _schemas_by_fingerprint() -> dict[bytes, tuple[str, Any]]:
    table: dict[bytes, tuple[str, Any]] = {}
    for path in SCHEMAS.glob("*/*.avsc"):
        parsed = fastavro.parse_schema(json.loads(path.read_text()))
        fp = bytes.fromhex(
            fingerprint(to_parsing_canonical_form(parsed), "CRC-64-AVRO")
        )
        table[fp] = (path.name, parsed)
    return table


def test_kcat_reads_events_that_decode_with_the_schema_files_alone(
    kafka_settings: KafkaSettings,
) -> None:
    kcat = shutil.which("kcat")
    assert kcat is not None, (
        "kcat is missing: make test installs it (apt-get install kcat)"
    )
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    events = script(run_id, steps=2)
    log = KafkaEventLog(kafka_settings)
    try:
        log.append(events)
    finally:
        log.close()
    # %R: the payload length as a big-endian 32-bit integer, then the raw payload.
    out = subprocess.run(
        [
            kcat,
            "-C",
            "-b",
            kafka_settings.bootstrap_servers,
            "-t",
            kafka_settings.events_topic,
            "-o",
            "beginning",
            "-e",
            "-q",
            "-f",
            "%R%s",
        ],
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout
    table = _schemas_by_fingerprint()
    stream = io.BytesIO(out)
    decoded = []
    while stream.tell() < len(out):
        size = int.from_bytes(stream.read(4), "big", signed=True)
        value = stream.read(size)
        assert value[:2] == b"\xc3\x01", "Avro single-object encoding"
        name, schema = table[value[2:10]]
        record = fastavro.schemaless_reader(io.BytesIO(value[10:]), schema, None)
        assert isinstance(record, dict)
        decoded.append((name, record))
    assert len(decoded) == len(events)
    for (name, record), event in zip(decoded, events, strict=True):
        assert name.startswith(f"{event.wire_name}.v")  # the writer's own version
        assert record["run_id"] == run_id
        assert record["seq"] == event.seq
        assert record["event_id"] == event.event_id
