"""``es-agents archive RUN`` / ``restore RUN``: a finished run to the object store
and its projection rows purged, or back (``es_agents.retention``)."""

from __future__ import annotations

import click

from es_agents.cli.base import cli, complete_run_id, emit, machine, output_option
from es_agents.cli.commands import client


@cli.command()
@click.argument("run_id", shell_complete=complete_run_id)
@click.option("--keep-rows", is_flag=True,
              help="Archive only: keep the run's projection rows.")  # fmt: skip
@output_option
def archive(run_id: str, keep_rows: bool) -> None:
    """Archive finished RUN: its events (as written) and the payload objects they
    claim, as one Avro object container file in the object store, read back and
    checked; then its projection rows and the payload objects no other run claims
    are deleted (its row in `runs` stays). Exit 1 for a run not finished or not
    fully projected."""
    with client() as c:
        done = c.archive(run_id, purge=not keep_rows)
    if machine():
        emit(
            {
                "run_id": run_id,
                "archive": done.key,
                "events": done.events,
                "payloads": done.payloads,
                "purged": done.purged,
                "deleted_objects": done.deleted,
            }
        )
    else:
        purged = (
            f"; its rows purged, {done.deleted} payload objects deleted"
            if done.purged
            else ""
        )
        click.echo(f"{run_id}: {done.events} events in {done.key}{purged}", err=True)


@cli.command()
@click.argument("run_id", shell_complete=complete_run_id)
@output_option
def restore(run_id: str) -> None:
    """Put archived RUN's events and payload objects back, after checking its
    archive (sequence, hash chain, payloads): status, show and replay read it from
    Postgres again. Exit 1 when the archive does not check, 3 when there is none."""
    with client() as c:
        events = c.restore(run_id)
    if machine():
        emit({"run_id": run_id, "restored_events": events})
    else:
        click.echo(f"{run_id}: {events} events restored", err=True)
