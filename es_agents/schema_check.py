"""``es-agents schemas check``: every schema can read what its earlier versions wrote.

Avro schema resolution, checked by structure: a reader field missing from the writer
needs a default (or an alias naming the writer's field); a field's type may only stay
the same or be promoted the ways Avro allows; unions, arrays, maps, records and enums
are checked inside. A published schema file never changes, so a change that fails
this check needs an upcaster (``AvroCodec(upcasters=...)``) and a new event name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from es_agents.codec import SCHEMAS_DIR, SchemaCatalog
from es_agents.core.commands import COMMAND_TYPES
from es_agents.core.events import EVENT_TYPES

PROMOTIONS = {
    "int": {"long", "float", "double"},
    "long": {"float", "double"},
    "float": {"double"},
    "string": {"bytes"},
    "bytes": {"string"},
}
PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}


def _kind(schema: Any) -> str:
    if isinstance(schema, list):
        return "union"
    if isinstance(schema, dict):
        kind = schema["type"]
        return kind if isinstance(kind, str) else _kind(kind)
    return str(schema)


def readable(  # noqa: PLR0911, PLR0912 - one case per Avro type
    writer: Any, reader: Any, path: str = ""
) -> list[str]:
    """Problems reading data written with ``writer`` through ``reader``."""
    wk, rk = _kind(writer), _kind(reader)
    if wk == "union":
        return [p for branch in writer for p in readable(branch, reader, path)]
    if rk == "union":
        for branch in reader:
            if not readable(writer, branch, path):
                return []
        return [f"{path or 'value'}: {wk} is in no branch of the reader's union"]
    if wk in PRIMITIVES or rk in PRIMITIVES:
        if wk == rk or rk in PROMOTIONS.get(wk, set()):
            return []
        return [f"{path or 'value'}: {wk} cannot be read as {rk}"]
    if wk != rk:
        return [f"{path or 'value'}: {wk} cannot be read as {rk}"]
    if wk == "array":
        return readable(writer["items"], reader["items"], f"{path}[]")
    if wk == "map":
        return readable(writer["values"], reader["values"], f"{path}{{}}")
    if wk == "enum":
        missing = set(writer["symbols"]) - set(reader["symbols"])
        if missing and "default" not in reader:
            return [f"{path}: enum symbols {sorted(missing)} unknown to the reader"]
        return []
    if wk == "record":
        problems = []
        written = {f["name"]: f for f in writer["fields"]}
        for field in reader["fields"]:
            names = [field["name"], *field.get("aliases", [])]
            source = next((written[n] for n in names if n in written), None)
            where = f"{path}.{field['name']}" if path else field["name"]
            if source is None:
                if "default" not in field:
                    problems.append(f"{where}: added without a default")
                continue
            problems += readable(source["type"], field["type"], where)
        return problems
    return []


def check(directory: Path = SCHEMAS_DIR) -> list[str]:
    """Every problem found in ``directory``; an empty list means all is well."""
    catalog = SchemaCatalog.load(directory)
    problems = []
    names = {info.wire_name for info in catalog}
    for wire_name in sorted({*EVENT_TYPES, *COMMAND_TYPES} - names):
        problems.append(f"{wire_name}: no schema")
    for wire_name in sorted(names):
        versions = catalog.versions(wire_name)
        numbers = [v.version for v in versions]
        if numbers != list(range(1, len(numbers) + 1)):
            problems.append(f"{wire_name}: versions {numbers} are not 1..n")
        for i, older in enumerate(versions):
            for newer in versions[i + 1 :]:
                for problem in readable(json.loads(older.text), json.loads(newer.text)):
                    problems.append(f"{newer.ref} cannot read {older.ref}: {problem}")
    return problems
