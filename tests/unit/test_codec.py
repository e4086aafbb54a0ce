from __future__ import annotations

import copy
import json

import pytest
from fastavro.schema import fingerprint, to_parsing_canonical_form
from hypothesis import given, settings
from hypothesis import strategies as st

from es_agents.codec import (
    AvroCodec,
    ConfluentSchemaRegistry,
    SchemaCatalog,
    SchemaInfo,
    crc64_avro,
)
from es_agents.core.commands import COMMAND_TYPES, Approve, Command
from es_agents.core.events import EVENT_TYPES, Event, ModelResponded, ToolCall, Usage
from es_agents.errors import ConfigError, DecodeError
from tests.avro_strategies import records

CATALOG = SchemaCatalog.load()
CODEC = AvroCodec(CATALOG)
SCHEMAS = sorted(CATALOG, key=lambda s: s.ref)


def test_every_event_and_command_has_a_schema() -> None:
    names = {s.wire_name for s in SCHEMAS}
    assert names == set(EVENT_TYPES) | set(COMMAND_TYPES)


def test_fingerprints_are_the_avro_specifications() -> None:
    # The Avro specification's example, then fastavro's own for every schema.
    assert crc64_avro('"int"').hex() == fingerprint('"int"', "CRC-64-AVRO")
    for info in SCHEMAS:
        canonical = to_parsing_canonical_form(info.parsed)
        assert info.fingerprint.hex() == fingerprint(canonical, "CRC-64-AVRO")
        assert info.fingerprint == crc64_avro(canonical)


def test_schema_fields_match_the_models() -> None:
    for wire_name, cls in {**EVENT_TYPES, **COMMAND_TYPES}.items():
        fields = [
            f["name"] for f in json.loads(CATALOG.latest(wire_name).text)["fields"]
        ]
        assert set(fields) == set(cls.model_fields), wire_name


@pytest.mark.parametrize("info", SCHEMAS, ids=lambda s: s.ref)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_every_schema_round_trips(info: SchemaInfo, data: st.DataObject) -> None:
    record = data.draw(records(json.loads(info.text)))
    assert isinstance(record, dict)
    encoded = CODEC.encode_with_schema(info, record)
    assert encoded[:2] == b"\xc3\x01"
    assert encoded[2:10] == info.fingerprint
    writer, decoded = CODEC.decode_record(encoded)
    assert writer == info
    # Decoded under the newest schema: a later version's added fields take defaults.
    assert {k: decoded[k] for k in record} == record


@pytest.mark.parametrize("info", SCHEMAS, ids=lambda s: s.ref)
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_models_round_trip_where_values_are_valid(
    info: SchemaInfo, data: st.DataObject
) -> None:
    record = data.draw(records(json.loads(info.text)))
    assert isinstance(record, dict)
    cls: type[Event] | type[Command] = (
        EVENT_TYPES[info.wire_name]
        if info.kind == "events"
        else COMMAND_TYPES[info.wire_name]
    )
    record.update(
        {
            "seq": abs(record.get("seq", 0)) % 2**63,
            "step": abs(record.get("step", 0)) % 2**31,
        }
    )
    for key in ("seq", "step"):
        if key not in cls.model_fields:
            record.pop(key)
    if "at_seq" in record:  # a fork's seq, like an event's
        record["at_seq"] = abs(int(str(record["at_seq"]))) % 2**63
    if "priority" in record:  # a start's priority is bounded
        record["priority"] = int(str(record["priority"])) % 1_000_001
    if record.get("tenant") == "" or len(str(record.get("tenant") or "")) > 200:
        record["tenant"] = "tenant"  # a tenant is 1 to 200 characters
    for key in ("run_id", "command_id", "origin_run"):  # ids must not be empty
        if key in record and not record[key]:
            record[key] = "id"
    message = cls.model_validate(record)
    assert CODEC.decode(CODEC.encode(message)).message == message


def _evolve(info: SchemaInfo) -> SchemaInfo:
    """The next version of a schema: one field added with a default, one renamed."""
    schema = json.loads(info.text)
    renamed = schema["fields"][-1]
    renamed["aliases"] = [renamed["name"]]
    renamed["name"] = renamed["name"] + "_v2"
    schema["fields"].append(
        {"name": "added_in_v2", "type": "string", "default": "filled-by-default"}
    )
    return SchemaInfo.from_text(
        info.kind, info.wire_name, info.version + 1, json.dumps(schema)
    )


@pytest.mark.parametrize("info", SCHEMAS, ids=lambda s: s.ref)
@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_old_writer_decodes_under_newer_reader(
    info: SchemaInfo, data: st.DataObject
) -> None:
    newer = _evolve(info)
    catalog = SchemaCatalog([info, newer])
    codec_old_and_new = AvroCodec(catalog, check_complete=False)
    record = data.draw(records(json.loads(info.text)))
    assert isinstance(record, dict)
    old_bytes = codec_old_and_new.encode_with_schema(info, record)
    writer, decoded = codec_old_and_new.decode_record(old_bytes)
    assert writer == info
    expected = copy.deepcopy(record)
    last = json.loads(info.text)["fields"][-1]["name"]
    expected[last + "_v2"] = expected.pop(last)
    expected["added_in_v2"] = "filled-by-default"
    assert decoded == expected


def _event() -> ModelResponded:
    return ModelResponded(
        run_id="r-1",
        seq=2,
        step=1,
        content="hi",
        tool_calls=(ToolCall(call_id="c1", name="search", args_json='{"q":"x"}'),),
        usage=Usage(prompt_tokens=10, completion_tokens=3),
    )


def test_garbage_is_a_decode_error() -> None:
    with pytest.raises(DecodeError, match="not an es-agents message"):
        CODEC.decode(b"hello world")
    with pytest.raises(DecodeError, match="not an es-agents message"):
        CODEC.decode(b"")


def test_unknown_fingerprint_is_a_decode_error() -> None:
    data = CODEC.encode(_event())
    with pytest.raises(DecodeError, match="unknown schema fingerprint"):
        CODEC.decode(data[:2] + b"\x00" * 8 + data[10:])


def test_truncated_and_padded_bodies_are_decode_errors() -> None:
    data = CODEC.encode(_event())
    with pytest.raises(DecodeError, match="does not decode"):
        CODEC.decode(data[:-5])
    with pytest.raises(DecodeError, match="trailing bytes"):
        CODEC.decode(data + b"\x00")


def test_valid_avro_with_invalid_values_is_a_decode_error() -> None:
    record = _event().model_dump()
    record["seq"] = -4
    data = CODEC.encode_record("model_responded", record)
    with pytest.raises(DecodeError, match="invalid values"):
        CODEC.decode(data)


def test_event_and_command_decoders_refuse_each_other() -> None:
    with pytest.raises(DecodeError, match="expected a command"):
        CODEC.decode_command(CODEC.encode(_event()))
    with pytest.raises(DecodeError, match="expected an event"):
        CODEC.decode_event(CODEC.encode(Approve(run_id="r-1", by="ann")))


def test_confluent_framing_with_a_registry() -> None:
    registry = ConfluentSchemaRegistry("mock://es-agents-test")
    codec = AvroCodec(CATALOG, registry=registry)
    event = _event()
    data = codec.encode(event)
    assert data[0] == 0
    schema_id = int.from_bytes(data[1:5], "big")
    assert registry.schema_text(schema_id)
    fresh = AvroCodec(CATALOG, registry=registry)  # learns the id from the registry
    assert fresh.decode(data).message == event
    with pytest.raises(DecodeError, match="no registry"):
        CODEC.decode(data)
    with pytest.raises(DecodeError, match="not in the registry"):
        fresh.decode(b"\x00" + (999_999).to_bytes(4, "big") + data[5:])


def test_catalog_refuses_bad_file_names(tmp_path: object) -> None:
    from pathlib import Path  # noqa: PLC0415

    assert isinstance(tmp_path, Path)
    (tmp_path / "events").mkdir()
    (tmp_path / "commands").mkdir()
    (tmp_path / "events" / "RunStarted.avsc").write_text("{}")
    with pytest.raises(ConfigError, match="expected <wire_name>"):
        SchemaCatalog.load(tmp_path)
