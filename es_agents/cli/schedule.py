"""``es-agents schedule add|list|show|pause|resume|delete``: runs started on a cron
expression or an interval, exactly once per tick (``es_agents.client_schedules``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import click

from es_agents.cli.base import cli, emit, emit_many, machine, output_option, table
from es_agents.cli.commands import _report, client, wait_options
from es_agents.client_schedules import ScheduleView


@cli.group()
def schedule() -> None:
    """Runs started on a cron expression or an interval, once per tick."""


@schedule.command("add")
@click.argument("name")
@click.option("--agent", required=True, help="The agent whose runs it starts.")
@click.option(
    "--cron", default=None, help='Five-field cron expression, in UTC ("0 7 * * 1-5").'
)
@click.option("--every", default=None, help="Or an interval: 90s, 15m, 2h, 1d.")
@click.option(
    "--input",
    "input_json",
    default="{}",
    show_default=True,
    help="Each run's input (JSON).",
)
@click.option(
    "--missed",
    type=click.Choice(["skip", "one", "all"]),
    default="skip",
    show_default=True,
    help="Ticks missed while nothing could fire them (every worker down, the "
    "broker out of reach): skip them, fire the latest one, or fire all.",
)
@click.option("--by", default="cli", show_default=True, help="Who sets it.")
@wait_options
@output_option
def schedule_add(  # noqa: PLR0917 - a schedule's parts
    name: str,
    agent: str,
    cron: str | None,
    every: str | None,
    input_json: str,
    missed: str,
    by: str,
    wait_seconds: float,
    no_wait: bool,
) -> None:
    """Create or replace schedule NAME. Each tick starts one run of the agent, with
    the id NAME-<tick, UTC, YYYYMMDDTHHMMSSZ>: a tick fired twice (two workers, a
    crash, a broker outage) starts it once."""
    with client() as c:
        result = c.schedules.set(
            name,
            agent,
            input_json,
            cron=cron,
            every=every,
            missed=missed,  # type: ignore[arg-type]
            by=by,
            wait=0 if no_wait else wait_seconds,
        )
    _report(result)


@schedule.command("list")
@click.option("--agent", default=None, help="Only this agent's schedules.")
@output_option
def schedule_list(agent: str | None) -> None:
    """Every schedule: when it fires, its policy, its next and last tick."""
    with client() as c:
        rows = [_row(v) for v in c.schedules.list(agent)]
    if machine():
        emit_many(rows)
        return
    table(
        rows, ["name", "agent", "when", "missed", "paused", "next_due", "last_run_id"]
    )


@schedule.command("show")
@click.argument("name")
@output_option
def schedule_show(name: str) -> None:
    """One schedule (exit 3 when there is none)."""
    with client() as c:
        row = _row(c.schedules.get(name))
    if machine():
        emit(row)
        return
    for key, value in row.items():
        click.echo(f"{key:12} {value if value is not None else '-'}")


def _change(action: str) -> Any:
    @click.argument("name")
    @click.option("--by", default="cli", show_default=True)
    @wait_options
    @output_option
    def change(name: str, by: str, wait_seconds: float, no_wait: bool) -> None:
        with client() as c:
            act = getattr(c.schedules, action)
            _report(act(name, by=by, wait=0 if no_wait else wait_seconds))

    return change


schedule.command(
    "pause", help="Fire no tick of NAME until it is resumed (exit 3: no such schedule)."
)(_change("pause"))
schedule.command(
    "resume",
    help="Fire NAME again from its next tick on (not the ticks while paused).",
)(_change("resume"))
schedule.command("delete", help="No more ticks of NAME; the runs it started stay.")(
    _change("delete")
)


def _row(v: ScheduleView) -> dict[str, Any]:
    def at(t: datetime | None) -> str | None:
        return None if t is None else t.isoformat(timespec="seconds")

    return {
        "name": v.name,
        "agent": v.agent,
        "when": v.when,
        "created_at": at(v.created_at),
        "missed": v.missed,
        "paused": v.paused,
        "next_due": at(v.next_due),
        "last_tick": at(v.last_tick),
        "last_run_id": v.last_run_id,
        "input": v.input_json,
    }
