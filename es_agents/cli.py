"""``es-agents``: the command line for people and scripts."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import TypeVar

import click

from es_agents.errors import ConfigError, EsAgentsError

F = TypeVar("F", bound=Callable[..., object])


def _echo_json(value: object) -> None:
    click.echo(json.dumps(value, default=str, sort_keys=True))


def _table(rows: list[dict[str, object]], columns: list[str]) -> None:
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
            _echo_json(
                {
                    "service": s.name,
                    "endpoint": s.endpoint,
                    "pid": s.pid,
                    "answers": s.answers,
                }
            )
    else:
        _table(rows, ["service", "endpoint", "pid", "answers"])
    if not all(s.answers for s in statuses):
        sys.exit(1)


@cli.command()
@click.option(
    "--partitions", type=int, default=None, help="Override ES_AGENTS_PARTITIONS."
)
def topics(partitions: int | None) -> None:
    """Create the commands, events and DLQ topics (idempotent)."""
    from es_agents.adapters.kafka import ensure_topics  # noqa: PLC0415
    from es_agents.settings import load_settings  # noqa: PLC0415

    overrides = {} if partitions is None else {"partitions": partitions}
    settings = load_settings(**overrides).kafka
    ensure_topics(settings)
    click.echo(
        f"{settings.commands_topic}, {settings.events_topic}, {settings.dlq_topic}: "
        f"{settings.partitions} partitions"
    )


@cli.command()
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per event.")
def replay(run_id: str, as_json: bool) -> None:
    """Read a run's events from the log (an audit) and print the folded state."""
    from es_agents.adapters.kafka import KafkaEventLog  # noqa: PLC0415
    from es_agents.core import replay as fold_all  # noqa: PLC0415
    from es_agents.settings import load_settings  # noqa: PLC0415

    log = KafkaEventLog(load_settings().kafka)
    try:
        events = log.read_run(run_id)
    finally:
        log.close()
    if not events:
        raise click.ClickException(f"no events for run {run_id}")
    for event in events:
        if as_json:
            _echo_json({"type": event.wire_name, **event.model_dump(mode="json")})
        else:
            click.echo(
                f"{event.seq:>5} step {event.step:>4}  {event.wire_name:<22} "
                f"{event.at:%H:%M:%S.%f}"[:-3]
            )
    state = fold_all(events)
    if not as_json:
        click.echo(f"status={state.status} step={state.step} events={state.seq + 1}")


@cli.command()
@click.option("--steps", type=int, default=5, show_default=True)
def demo(steps: int) -> None:
    """Append a run's events to the real log, read them back, fold and print them."""
    from es_agents.demo import run_log_demo  # noqa: PLC0415

    if not run_log_demo(steps=steps, echo=click.echo):
        sys.exit(1)


def main() -> None:
    try:
        cli(standalone_mode=False)
    except click.exceptions.Abort:
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except ConfigError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    except EsAgentsError as e:
        click.echo(f"error: {type(e).__name__}: {e}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
