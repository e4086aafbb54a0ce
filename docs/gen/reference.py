"""Pages generated when the site is built (mkdocs-gen-files): every setting from the
settings models, and every event and command schema from its ``.avsc`` file. They
cannot drift from the code: they are read from it."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import mkdocs_gen_files
from pydantic import SecretStr
from pydantic_settings import BaseSettings

from es_agents.dev.config import DevSettings
from es_agents.settings import KafkaSettings, ModelSettings, Settings

SCHEMAS = Path(__file__).resolve().parents[2] / "es_agents" / "schemas"


def _default(field: Any) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
    else:
        value = field.default
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    if value is None:
        return "unset"
    if isinstance(value, Path):
        value = str(value).replace(str(Path.home()), "~")
    if isinstance(value, dict | list):
        return f"`{json.dumps(value)}`" if value else "empty"
    return f"`{value}`"


def _type(field: Any) -> str:
    text = str(field.annotation)
    text = re.sub(r"typing\.|pydantic\.types\.|<class '([^']+)'>", r"\1", text)
    text = text.replace("Literal", "one of ").replace("NoneType", "None")
    return text.replace("|", "\\|")


def settings_rows(model: type[BaseSettings], prefix: str) -> list[str]:
    rows = []
    for name, field in model.model_fields.items():
        if name == "kafka":
            continue
        doc = (field.description or "").replace("|", "\\|").replace("\n", " ")
        rows.append(
            f"| `{prefix}{name.upper()}` | {_type(field)} | {_default(field)} | {doc} |"
        )
    return rows


SETTINGS_INTRO = """# Settings

Every process reads its settings from `ES_AGENTS_*` environment variables (or the
flags of a command), with pydantic-settings, and checks them when it starts: a bad
value exits with code 2 and names the setting. This page is generated from the
settings models (`es_agents.settings`), so it lists every setting with its default.

`KafkaSettings.to_librdkafka()` is the one place that knows librdkafka's keys.

"""

HEADER = "| variable | type | default | what |\n| --- | --- | --- | --- |"

OTHER = """
## Read outside the settings models

| variable | default | what |
| --- | --- | --- |
| `ES_AGENTS_LOG_LEVEL`, `ES_AGENTS_LOG_FORMAT` | info for workers and projectors, warning for the rest; JSON when stderr is not a terminal | the log's level and `json` or `text` lines |
| `ES_AGENTS_UI_USERS`, `ES_AGENTS_UI_SECRET`, `ES_AGENTS_UI_USER_HEADER` | unset | the web UI's password file, the key of its session cookies, the header an authenticating proxy sets (`es-agents ui --help`) |
| `ES_AGENTS_CRASH_AT` | unset | testing only: a worker SIGKILLs itself at this protocol point |
"""


def settings_page() -> str:
    parts = [SETTINGS_INTRO]
    for title, model, prefix in (
        ("The log and Kafka", KafkaSettings, "ES_AGENTS_"),
        ("Stores, runs and processes", Settings, "ES_AGENTS_"),
        (
            "A real model (`es_agents.app.build_model()`)",
            ModelSettings,
            "ES_AGENTS_MODEL_",
        ),
        ("The local stack (`es-agents dev`)", DevSettings, "ES_AGENTS_DEV_"),
    ):
        parts.append(
            f"## {title}\n\n{HEADER}\n" + "\n".join(settings_rows(model, prefix))
        )
    parts.append(OTHER)
    return "\n\n".join(parts)


def _avro_type(t: Any) -> str:  # noqa: PLR0911 - one per Avro type
    if isinstance(t, str):
        return t
    if isinstance(t, list):
        return " \\| ".join(_avro_type(x) for x in t)
    if t.get("logicalType"):
        return t["logicalType"]
    if t["type"] == "array":
        return f"array of {_avro_type(t['items'])}"
    if t["type"] == "map":
        return f"map of {_avro_type(t['values'])}"
    if t["type"] in ("record", "enum", "fixed"):
        return t["name"]
    return str(t["type"])


SCHEMAS_INTRO = """# Event and command schemas

Every event and command is an Avro record with a schema of its own in
`es_agents/schemas/{events,commands}/<name>.v<N>.avsc`. A published schema never
changes: a new version is a new file, and readers resolve older ones (see
[the version gate](../explanation/version-gate.md)). Each record on the wire names its
writer schema by fingerprint ([the log](../explanation/log.md)). This page is
generated from those files: for each name, its newest version's fields.
"""


def schemas_page() -> str:
    parts = [SCHEMAS_INTRO]
    for kind in ("events", "commands"):
        versions: dict[str, list[int]] = defaultdict(list)
        for f in SCHEMAS.joinpath(kind).glob("*.avsc"):
            name, v, _ = f.name.rsplit(".", 2)
            versions[name].append(int(v[1:]))
        parts.append(f"## {kind.capitalize()}")
        for name in sorted(versions):
            newest = max(versions[name])
            schema = json.loads(
                SCHEMAS.joinpath(kind, f"{name}.v{newest}.avsc").read_text()
            )
            older = ", ".join(f"v{v}" for v in sorted(versions[name]) if v != newest)
            rows = [
                "| field | type | default | what |",
                "| --- | --- | --- | --- |",
            ]
            for field in schema["fields"]:
                default = (
                    f"`{json.dumps(field['default'])}`" if "default" in field else ""
                )
                doc = field.get("doc", "").replace("|", "\\|")
                rows.append(
                    f"| `{field['name']}` | {_avro_type(field['type'])} | {default} | {doc} |"
                )
            parts.append(
                f"### `{name}` (v{newest})\n\n{schema.get('doc', '')}"
                + (f" Older versions, still read: {older}." if older else "")
                + "\n\n"
                + "\n".join(rows)
            )
    return "\n\n".join(parts) + "\n"


with mkdocs_gen_files.open("reference/settings.md", "w") as page:
    page.write(settings_page())
with mkdocs_gen_files.open("reference/schemas.md", "w") as page:
    page.write(schemas_page())
