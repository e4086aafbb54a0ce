"""``es-agents dev``: the local stack."""

from __future__ import annotations

import sys

import click

from es_agents.cli.base import cli, echo_json, table


@cli.group()
def dev() -> None:
    """The local stack: Kafka (KRaft), Postgres and an S3 server, without Docker."""


@dev.command("up")
def dev_up() -> None:
    """Install what is missing and start what is not running (idempotent)."""
    from es_agents.dev import KAFKA_VERSION, DevStack  # noqa: PLC0415

    stack = DevStack()
    seconds = stack.up(log=click.echo)
    for status in stack.status():
        click.echo(f"  {status.name:<9} {status.endpoint}")
    click.echo(
        f"dev stack up in {seconds:.2f}s (Kafka {KAFKA_VERSION}, home {stack.dev.root})"
    )


@dev.command("down")
def dev_down() -> None:
    """Stop exactly the processes `dev up` started (by pid)."""
    from es_agents.dev import DevStack  # noqa: PLC0415

    DevStack().down(log=click.echo)


@dev.command("status")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def dev_status(as_json: bool) -> None:
    """Each service's endpoint, pid and whether it answers; exit 1 if one does not."""
    from es_agents.dev import DevStack  # noqa: PLC0415

    statuses = DevStack().status()
    rows: list[dict[str, object]] = [
        {
            "service": s.name,
            "endpoint": s.endpoint,
            "pid": s.pid or "-",
            "answers": "yes" if s.answers else "no",
        }
        for s in statuses
    ]
    if as_json:
        for s in statuses:
            echo_json(
                {
                    "service": s.name,
                    "endpoint": s.endpoint,
                    "pid": s.pid,
                    "answers": s.answers,
                }
            )
    else:
        table(rows, ["service", "endpoint", "pid", "answers"])
    if not all(s.answers for s in statuses):
        sys.exit(1)
