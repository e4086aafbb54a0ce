"""The ``es-agents`` group and what its commands share."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TypeVar

import click

F = TypeVar("F", bound=Callable[..., object])


def echo_json(value: object) -> None:
    click.echo(json.dumps(value, default=str, sort_keys=True))


def table(rows: list[dict[str, object]], columns: list[str]) -> None:
    widths = {
        c: max([len(c), *(len(str(r.get(c, ""))) for r in rows)]) for c in columns
    }
    click.echo("  ".join(c.upper().ljust(widths[c]) for c in columns).rstrip())
    for row in rows:
        click.echo(
            "  ".join(str(row.get(c, "")).ljust(widths[c]) for c in columns).rstrip()
        )


@click.group()
@click.version_option(package_name="es-agents")
def cli() -> None:
    """Durable LLM-agent runs on a Kafka log, with Postgres as the read side."""
