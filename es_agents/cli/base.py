"""The ``es-agents`` group and what its commands share: the output format
(``-o text|json|jsonl``), times in ISO-8601 UTC, and the exit codes.

Exit codes, the same for every command: 0 ok; 1 refused, or a check found a
mismatch; 2 usage or configuration; 3 not found; 4 a service is unavailable.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., object])

EXIT_OK, EXIT_REFUSED, EXIT_USAGE, EXIT_NOT_FOUND, EXIT_UNAVAILABLE = 0, 1, 2, 3, 4
FORMATS = ("text", "json", "jsonl")


class _Output:
    """What the invocation asked for; read by ``main`` to format errors too."""

    format = "text"


OUTPUT = _Output()


def iso(value: datetime) -> str:
    """ISO-8601 in UTC (naive times are taken as UTC)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _default(value: object) -> object:
    if isinstance(value, datetime):
        return iso(value)
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def dumps(value: object) -> str:
    return json.dumps(value, default=_default, sort_keys=True)


def echo_json(value: object) -> None:
    click.echo(dumps(value))


def machine() -> bool:
    """True when the output is for a program (json or jsonl)."""
    return OUTPUT.format != "text"


def emit(value: dict[str, Any]) -> None:
    """One object: a JSON line for programs (json and jsonl alike)."""
    echo_json(value)


def emit_many(values: Iterable[dict[str, Any]]) -> None:
    """Many objects: one JSON array (json) or one object per line (jsonl)."""
    if OUTPUT.format == "jsonl":
        for value in values:
            echo_json(value)
    else:
        click.echo(dumps(list(values)))


def text(value: object) -> str:
    """A value as a person reads it (times in ISO-8601 UTC)."""
    return iso(value) if isinstance(value, datetime) else str(value)


def table(rows: list[dict[str, object]], columns: list[str]) -> None:
    cells = [{c: text(r.get(c, "")) for c in columns} for r in rows]
    widths = {c: max([len(c), *(len(r[c]) for r in cells)]) for c in columns}
    click.echo("  ".join(c.upper().ljust(widths[c]) for c in columns).rstrip())
    for row in cells:
        click.echo("  ".join(row[c].ljust(widths[c]) for c in columns).rstrip())


def _set_format(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is not None:
        OUTPUT.format = value


def _set_json(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        OUTPUT.format = "jsonl"


def output_option(fn: F) -> F:
    """``-o text|json|jsonl`` on a command (also accepted before the command), and
    the older ``--json`` (same as ``-o jsonl``: one object per line)."""
    fn = click.option(
        "--json",
        "_json",
        is_flag=True,
        expose_value=False,
        callback=_set_json,
        help="Same as -o jsonl.",
    )(fn)
    return _format_option("Output format (errors too: {error, kind} as JSON).")(fn)


def _format_option(help_text: str, eager: bool = False) -> Callable[[F], F]:
    """``-o text|json|jsonl``: the same option on the group and on each command."""
    return click.option(
        "-o",
        "--output",
        "_output",
        type=click.Choice(FORMATS),
        default=None,
        expose_value=False,
        is_eager=eager,
        callback=_set_format,
        help=help_text,
    )


def _set_log_level(
    ctx: click.Context, param: click.Parameter, value: str | None
) -> None:
    """Logs on stderr at the level asked for (workers and projectors log at info
    when none is). Client libraries retry on their own: their chatter is news only
    when debugging, and a command that fails says so in one line."""
    import logging  # noqa: PLC0415

    level = getattr(logging, value.upper()) if value else None
    if level is not None:
        logging.basicConfig(
            level=level,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
            force=True,
        )
    quiet = logging.DEBUG if level == logging.DEBUG else logging.CRITICAL
    for name in ("es_agents.librdkafka", "psycopg", "botocore", "urllib3"):
        logging.getLogger(name).setLevel(quiet)


@click.group()
@click.version_option(package_name="es-agents")
@_format_option("Output format of every command, errors included.", eager=True)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
    default=None,
    expose_value=False,
    is_eager=True,
    callback=_set_log_level,
    envvar="ES_AGENTS_LOG_LEVEL",
    help="Logs on stderr (default: info for workers and projectors, warning "
    "for the rest; debug shows the Kafka and Postgres clients' own).",
)
def cli() -> None:
    """Durable LLM-agent runs on a Kafka log, with Postgres as the read side.

    Exit codes: 0 ok, 1 refused or mismatch, 2 usage, 3 not found, 4 unavailable.
    """


def complete_run_id(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[click.shell_completion.CompletionItem]:
    """Shell completion of a run id: the latest runs of the ``runs`` table whose id
    starts with what was typed. Quiet and quick: nothing when Postgres does not
    answer within a second."""
    from es_agents.app import build_ports  # noqa: PLC0415
    from es_agents.settings import load_settings  # noqa: PLC0415

    try:
        settings = load_settings().model_copy(update={"connect_timeout": 1.0})
        ports = build_ports(settings, pool_size=1, migrate=False, db_timeout=1.0)
    except Exception:
        return []
    try:
        rows = ports.projections.runs(None, 500)
    except Exception:
        return []
    finally:
        ports.close()
    return [
        click.shell_completion.CompletionItem(str(r["run_id"]), help=str(r["status"]))
        for r in rows
        if str(r["run_id"]).startswith(incomplete)
    ]


class IsoTime(click.ParamType[datetime, object]):
    """A time as the CLI prints them and as people write them: ISO-8601 with
    ``Z``, an offset, fractions of a second, ``T`` or a space, or a date alone;
    without an offset it is UTC. The value is an aware UTC datetime."""

    name = "TIME"

    def convert(
        self, value: object, param: click.Parameter | None, ctx: click.Context | None
    ) -> datetime:
        if isinstance(value, datetime):
            parsed = value
        else:
            try:
                parsed = datetime.fromisoformat(str(value).strip())
            except ValueError:
                self.fail(
                    f"{value!r} is not an ISO-8601 time (e.g. 2026-12-05, "
                    "2026-12-05T18:00:00Z, 2026-12-05 18:00+01:00)",
                    param,
                    ctx,
                )
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)
        return parsed.astimezone(UTC)


ISO_TIME = IsoTime()
