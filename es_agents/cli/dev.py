"""``es-agents dev``: the local stack."""

from __future__ import annotations

import sys

import click

from es_agents.cli.base import (
    EXIT_UNAVAILABLE,
    cli,
    emit,
    emit_many,
    machine,
    output_option,
    table,
)


@cli.group()
def dev() -> None:
    """The local stack: Kafka (KRaft), Postgres and an S3 server, without Docker."""


@dev.command("up")
@click.option(
    "--brokers",
    type=click.IntRange(min=1, max=9),
    default=None,
    help="Kafka brokers: 3 makes a replicated KRaft cluster (replication factor 3, "
    "min.insync.replicas 2). Default: what the stack was made with, else 1.",
)
@output_option
def dev_up(brokers: int | None) -> None:
    """Install what is missing and start what is not running (idempotent)."""
    from es_agents.dev import KAFKA_VERSION, DevSettings, DevStack  # noqa: PLC0415

    dev = DevSettings()
    if brokers is not None and brokers != dev.brokers:
        if any(s.proc.pid() for s in DevStack(dev).brokers):
            raise click.UsageError(
                f"the dev stack runs {dev.brokers} broker(s): `es-agents dev down` "
                f"first, then `dev up --brokers {brokers}`"
            )
        dev = DevSettings(kafka_brokers=brokers)
    stack = DevStack(dev)
    seconds = stack.up(log=lambda line: click.echo(line, err=machine()))
    replicas, min_isr = dev.replication
    if machine():
        emit(
            {
                "seconds": round(seconds, 2),
                "kafka_version": KAFKA_VERSION,
                "home": str(stack.dev.root),
                "services": {s.name: s.endpoint for s in stack.status()},
                "bootstrap_servers": dev.kafka_bootstrap,
                "replication_factor": replicas,
                "min_insync_replicas": min_isr,
            }
        )
        return
    for status in stack.status():
        click.echo(f"  {status.name:<9} {status.endpoint}")
    if len(stack.brokers) > 1:
        click.echo(
            f"  settings: ES_AGENTS_BOOTSTRAP_SERVERS={dev.kafka_bootstrap} "
            f"ES_AGENTS_REPLICATION_FACTOR={replicas} "
            f"ES_AGENTS_MIN_INSYNC_REPLICAS={min_isr}"
        )
    click.echo(
        f"dev stack up in {seconds:.2f}s (Kafka {KAFKA_VERSION}, home {stack.dev.root})"
    )


@dev.command("down")
@output_option
def dev_down() -> None:
    """Stop exactly the processes `dev up` started (by pid)."""
    from es_agents.dev import DevStack  # noqa: PLC0415

    lines: list[str] = []
    DevStack().down(log=lines.append if machine() else click.echo)
    if machine():
        emit({"stopped": lines})


@dev.command("status")
@output_option
def dev_status() -> None:
    """Each service's endpoint, pid and whether it answers; exit 4 if one does not."""
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
    if machine():
        emit_many(
            {
                "service": s.name,
                "endpoint": s.endpoint,
                "pid": s.pid,
                "answers": s.answers,
            }
            for s in statuses
        )
    else:
        table(rows, ["service", "endpoint", "pid", "answers"])
    if not all(s.answers for s in statuses):
        sys.exit(EXIT_UNAVAILABLE)
