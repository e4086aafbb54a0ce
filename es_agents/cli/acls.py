"""``es-agents acls``: the Kafka ACLs that let only workers write events and
clients write nothing but commands (``es_agents.adapters.kafka_acls``)."""

from __future__ import annotations

from dataclasses import asdict

import click

from es_agents.cli.base import cli, emit_many, machine, output_option, table


@cli.command()
@click.option("--worker", required=True, help="The workers' principal (User:NAME).")
@click.option("--client", required=True, help="The clients' principal (User:NAME).")
@click.option("--projector", required=True, help="The projectors' principal.")
@click.option("--apply", "apply_them", is_flag=True,
              help="Create them (as an administrator of the cluster).")  # fmt: skip
@output_option
def acls(worker: str, client: str, projector: str, apply_them: bool) -> None:
    """The ACLs of the topic prefix for three principals: workers write events,
    commands, dead letters and the answer stream; clients write commands;
    projectors write dead letters; all three read the prefix's topics and use its
    groups. Printed, and with --apply created (the brokers need an authorizer and
    allow.everyone.if.no.acl.found=false for them to bind)."""
    from es_agents.app import kafka_acls  # noqa: PLC0415
    from es_agents.settings import load_settings  # noqa: PLC0415

    wanted = kafka_acls(load_settings(), worker, client, projector, apply_them)
    rows = [asdict(g) for g in wanted]
    if machine():
        emit_many(rows)
    else:
        table(rows, ["principal", "resource", "name", "pattern", "operation"])
        if apply_them:
            click.echo(f"{len(rows)} ACLs created", err=True)
