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
@click.option(
    "--acls/--no-acls",
    default=None,
    help="Kafka that asks who is there: SASL/SCRAM users es-admin, es-worker, "
    "es-client and es-projector, and ACLs by which only workers write events and "
    "clients only commands (`dev env --role` prints each one's settings). Its "
    "records are kept apart from the open broker's. Default: what the stack was "
    "made with, else off.",
)
@output_option
def dev_up(brokers: int | None, acls: bool | None) -> None:
    """Install what is missing and start what is not running (idempotent)."""
    from es_agents.dev import KAFKA_VERSION, DevSettings, DevStack  # noqa: PLC0415

    dev = DevSettings()
    wanted = {
        "kafka_brokers": brokers if brokers is not None else dev.brokers,
        "kafka_acls": acls if acls is not None else dev.acls,
    }
    if (wanted["kafka_brokers"], wanted["kafka_acls"]) != (dev.brokers, dev.acls):
        if any(s.proc.pid() for s in DevStack(dev).brokers):
            now = f"{dev.brokers} broker(s), ACLs {'on' if dev.acls else 'off'}"
            raise click.UsageError(
                f"the dev stack runs {now}: `es-agents dev down` first, then "
                "`dev up` with the new options"
            )
        dev = DevSettings(**wanted)  # type: ignore[arg-type]
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
                "acls": dev.acls,
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
    if dev.acls:
        click.echo(
            "  ACLs on: each role's settings with `eval \"$(es-agents dev env "
            '--role worker)"` (roles: admin, worker, client, projector)'
        )
    click.echo(
        f"dev stack up in {seconds:.2f}s (Kafka {KAFKA_VERSION}, home {stack.dev.root})"
    )


@dev.command("env")
@click.option(
    "--role",
    type=click.Choice(["admin", "worker", "client", "projector"]),
    default="admin",
    show_default=True,
    help="Whose SASL user (a stack made with --acls).",
)
@output_option
def dev_env(role: str) -> None:
    """The ES_AGENTS_* settings that reach the dev stack's Kafka, as shell exports
    (`eval "$(es-agents dev env --role worker)"`): the brokers, replication and, with
    ACLs on, the role's SASL user and password."""
    import shlex  # noqa: PLC0415

    from es_agents.dev import DevSettings  # noqa: PLC0415
    from es_agents.dev.secured import environment, reach  # noqa: PLC0415

    dev = DevSettings()
    if dev.acls:
        values = environment(dev, role)  # type: ignore[arg-type]
    elif role != "admin":
        raise click.UsageError(
            "the dev stack runs without ACLs (every client may do anything): "
            "`es-agents dev down`, then `dev up --acls`"
        )
    else:
        values = reach(dev)
    if machine():
        emit(values)
        return
    for key, value in values.items():
        click.echo(f"export {key}={shlex.quote(value)}")


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
