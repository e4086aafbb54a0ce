"""A finished run's archive (``es_agents.archive``): an Avro object container file
that fastavro alone reads -- every event's fields as JSON, its bytes as written,
its claimed payloads -- and that ``check`` finds wrong when anything in it was
changed, dropped or reordered."""

from __future__ import annotations

import io
import json
from typing import Any

import fastavro
import pytest

from es_agents import archive
from es_agents.codec import AvroCodec
from es_agents.core.chain import seal
from es_agents.core.events import (
    Event,
    ModelResponded,
    PayloadClaim,
    RunCompleted,
    RunStarted,
)
from es_agents.errors import DecodeError, PayloadUnavailable

CODEC = AvroCodec()
BIG = b"a page of the web, too large for an event " * 10
CLAIM = PayloadClaim(
    field="content",
    sha256=archive.sha256(BIG),
    size=len(BIG),
    key=f"sha256/{archive.sha256(BIG)}",
)


def _written(run_id: str = "run-a") -> list[archive.Written]:
    events: list[Event] = [
        RunStarted(
            run_id=run_id, seq=0, step=0, agent="a", input_json="{}", command_id="c0"
        ),
        ModelResponded(run_id=run_id, seq=1, step=1, content="", claims=(CLAIM,)),
        RunCompleted(run_id=run_id, seq=2, step=1, output_json='"done"'),
    ]
    sealed = seal(events, CODEC.encode, b"")
    return [
        archive.Written(n, 0, 100 + n, s.value, f"mac-{n}")
        for n, s in enumerate(sealed)
    ]


def _file(rows: list[archive.Written], objects: dict[str, bytes]) -> bytes:
    return archive.write("run-a", "tests", rows, CODEC, archive.Kept(objects).get)


def test_fastavro_alone_reads_every_event_and_payload() -> None:
    data = _file(_written(), {CLAIM.key: BIG})
    reader = fastavro.reader(io.BytesIO(data))
    records: list[dict[str, Any]] = [dict(r) for r in reader]  # type: ignore[arg-type]
    assert reader.metadata["es_agents.run_id"] == "run-a"
    assert reader.metadata["es_agents.events"] == "3"
    assert [r["type"] for r in records] == [
        "run_started", "model_responded", "run_completed",
    ]  # fmt: skip
    completed = json.loads(records[2]["event"])
    assert completed["output_json"] == '"done"'
    assert records[1]["payloads"] == [{"key": CLAIM.key, "data": BIG}]
    # The bytes as written decode with fastavro too, by the schemas in the file.
    schemas = json.loads(reader.metadata["es_agents.schemas"])
    written = records[0]["written"]
    schema = fastavro.parse_schema(json.loads(schemas[written[2:10].hex()]))
    first = fastavro.schemaless_reader(io.BytesIO(written[10:]), schema, None)
    assert isinstance(first, dict)
    assert first["agent"] == "a"


def test_an_archive_checks_and_gives_back_what_was_written() -> None:
    rows = _written()
    made = archive.read(_file(rows, {CLAIM.key: BIG}))
    assert archive.check(made, CODEC.decode_event, last_seq=2) == []
    assert made.written() == rows
    assert made.payloads() == {CLAIM.key: BIG}
    # The same events make the same bytes (two workers archiving one run).
    assert _file(rows, {CLAIM.key: BIG}) == _file(rows, {CLAIM.key: BIG})


def test_no_archive_without_every_payload() -> None:
    with pytest.raises(PayloadUnavailable):
        _file(_written(), {})


def _tampered(change: str) -> list[str]:
    rows = _written()
    made = archive.read(_file(rows, {CLAIM.key: BIG}))
    records = made.records
    if change == "dropped":
        del records[1]
    elif change == "swapped":
        records[1], records[2] = records[2], records[1]
    elif change == "json":
        records[2]["event"] = records[2]["event"].replace("done", "undone")
    elif change == "payload":
        records[1]["payloads"] = [{"key": CLAIM.key, "data": b"other"}]
    elif change == "bytes":
        records[2]["written"] = records[2]["written"].replace(b"done", b"dune")
    return archive.check(made, CODEC.decode_event, last_seq=2)


@pytest.mark.parametrize(
    ("change", "found"),
    [
        ("dropped", "expected seq 1"),
        ("swapped", "does not chain"),
        ("json", "its JSON is not what its bytes say"),
        ("payload", "missing or altered"),
        ("bytes", "head is not the last event's digest"),
    ],
)
def test_check_finds_each_change(change: str, found: str) -> None:
    problems = _tampered(change)
    assert any(found in p for p in problems), problems


def test_a_file_that_is_not_an_archive_is_refused() -> None:
    with pytest.raises(DecodeError, match="not an archive"):
        archive.read(b"not avro at all")
