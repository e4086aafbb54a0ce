"""Hypothesis strategies that generate valid records for any of our Avro schemas."""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import strategies as st

_TS_MIN = datetime(1970, 1, 1)
_TS_MAX = datetime(2200, 1, 1)


def _millis(dt: datetime) -> datetime:
    return dt.replace(microsecond=dt.microsecond // 1000 * 1000)


def records(schema: object) -> st.SearchStrategy[object]:
    return _strategy(schema, {})


def _strategy(  # noqa: PLR0911 - one return per Avro type
    schema: object, names: dict[str, object]
) -> st.SearchStrategy[object]:
    if isinstance(schema, list):
        return st.one_of([_strategy(branch, names) for branch in schema])
    if isinstance(schema, str):
        primitive = {
            "null": st.none(),
            "boolean": st.booleans(),
            "int": st.integers(-(2**31), 2**31 - 1),
            "long": st.integers(-(2**63), 2**63 - 1),
            "float": st.floats(width=32, allow_nan=False),
            "double": st.floats(allow_nan=False),
            "string": st.text(max_size=40),
            "bytes": st.binary(max_size=40),
        }
        if schema in primitive:
            return primitive[schema]
        return _strategy(names[schema], names)
    assert isinstance(schema, dict)
    kind = schema["type"]
    logical = schema.get("logicalType")
    if logical in ("timestamp-millis", "timestamp-micros"):
        return st.datetimes(
            min_value=_TS_MIN, max_value=_TS_MAX, timezones=st.just(UTC)
        ).map(_millis)
    if kind == "record":
        names[schema["name"]] = schema
        fields = {f["name"]: _strategy(f["type"], names) for f in schema["fields"]}
        return st.fixed_dictionaries(fields)
    if kind == "array":
        return st.lists(_strategy(schema["items"], names), max_size=3)
    if kind == "map":
        return st.dictionaries(
            st.text(max_size=10), _strategy(schema["values"], names), max_size=3
        )
    if kind == "enum":
        return st.sampled_from(schema["symbols"])
    return _strategy(kind, names)
