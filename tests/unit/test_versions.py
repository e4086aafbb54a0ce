"""The version gate's decisions, schema compatibility, and upcasters."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

from es_agents.codec import SCHEMAS_DIR, AvroCodec, SchemaCatalog, SchemaInfo
from es_agents.core.state import RunState, Versions
from es_agents.core.versions import (
    Migrate,
    Refuse,
    StateMigration,
    Verbatim,
    VersionPolicy,
    gate,
)
from es_agents.schema_check import check, readable

V1 = Versions(
    agent_version="a@1",
    code_revision="r1",
    prompt_hash="p1",
    model_id="m1",
    tools_hash="t1",
    reducer_version=1,
)


def _with(**changes: str) -> Versions:
    return dataclasses.replace(V1, **changes)  # type: ignore[arg-type]


def test_same_versions_resume_verbatim_with_nothing_to_record() -> None:
    assert gate(V1, V1, VersionPolicy()) == Verbatim({})


def test_allowed_changes_resume_verbatim_and_name_what_changed() -> None:
    decision = gate(V1, _with(prompt_hash="p2", code_revision="r2"), VersionPolicy())
    assert decision == Verbatim(
        {"prompt_hash": ("p1", "p2"), "code_revision": ("r1", "r2")}
    )


def test_refused_changes_name_both_sides() -> None:
    decision = gate(V1, _with(tools_hash="t2"), VersionPolicy())
    assert isinstance(decision, Refuse)
    assert "tools_hash 't1' -> 't2'" in decision.reason
    strict = VersionPolicy(prompt_hash="refuse")
    assert isinstance(gate(V1, _with(prompt_hash="p2"), strict), Refuse)
    lenient = VersionPolicy(tools_hash="allow")
    assert isinstance(gate(V1, _with(tools_hash="t2"), lenient), Verbatim)


def test_a_registered_migration_moves_the_agent_version() -> None:
    migration = StateMigration(
        "a@1", "a@2", "renames a key", patch=lambda state: {"k": state.seq}
    )
    decision = gate(V1, _with(agent_version="a@2"), VersionPolicy(), [migration])
    assert isinstance(decision, Migrate)
    assert decision.migration.patch(RunState(run_id="r", seq=4)) == {"k": 4}
    unregistered = gate(V1, _with(agent_version="a@3"), VersionPolicy(), [migration])
    assert isinstance(unregistered, Refuse)
    assert "no migration is registered" in unregistered.reason


def test_the_repository_schemas_are_compatible() -> None:
    assert check() == []


def _schema(fields: list[dict[str, object]]) -> dict[str, object]:
    return {"type": "record", "name": "R", "fields": fields}


def test_compatibility_rules() -> None:
    old = _schema([{"name": "a", "type": "string"}, {"name": "n", "type": "int"}])
    assert (
        readable(
            old,
            _schema(
                [
                    {"name": "a", "type": "string"},
                    {"name": "n", "type": "long"},
                    {"name": "b", "type": "string", "default": ""},
                ]
            ),
        )
        == []
    )
    assert (
        readable(
            old, _schema([{"name": "renamed", "aliases": ["a"], "type": "string"}])
        )
        == []
    )
    assert readable(old, _schema([{"name": "b", "type": "string"}])) == [
        "b: added without a default"
    ]
    assert readable(old, _schema([{"name": "n", "type": "string"}])) == [
        "n: int cannot be read as string"
    ]
    assert readable(old, _schema([{"name": "n", "type": ["null", "long"]}])) == []


def test_schemas_check_fails_on_an_incompatible_new_version(tmp_path: Path) -> None:
    shutil.copytree(SCHEMAS_DIR, tmp_path / "schemas")
    v1 = json.loads((tmp_path / "schemas/events/state_patched.v1.avsc").read_text())
    v1["fields"].append({"name": "owner", "type": "string"})  # no default
    (tmp_path / "schemas/events/state_patched.v2.avsc").write_text(json.dumps(v1))
    problems = check(tmp_path / "schemas")
    assert problems == [
        "state_patched.v2 cannot read state_patched.v1: owner: added without a default"
    ]


def test_an_upcaster_reads_what_resolution_cannot() -> None:
    v1 = SchemaInfo.from_text(
        "events", "named", 1, json.dumps(_schema([{"name": "name", "type": "string"}]))
    )
    v2 = SchemaInfo.from_text(
        "events",
        "named",
        2,
        json.dumps(
            _schema(
                [
                    {"name": "first", "type": "string"},
                    {"name": "last", "type": "string"},
                ]
            )
        ),
    )
    catalog = SchemaCatalog([v1, v2])

    def split(record: dict[str, object]) -> dict[str, object]:
        first, _, last = str(record["name"]).partition(" ")
        return {"first": first, "last": last}

    codec = AvroCodec(catalog, check_complete=False, upcasters={("named", 1): split})
    old = codec.encode_with_schema(v1, {"name": "Ada Lovelace"})
    assert codec.decode_record(old) == (v1, {"first": "Ada", "last": "Lovelace"})
    new = codec.encode_with_schema(v2, {"first": "Grace", "last": "Hopper"})
    assert codec.decode_record(new)[1] == {"first": "Grace", "last": "Hopper"}
