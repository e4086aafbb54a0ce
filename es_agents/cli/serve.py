"""Running the system: ``topics``, ``migrate``, ``worker``, ``projector`` and
``serve`` (a worker and a projector, supervised)."""

from __future__ import annotations

import sys

import click

from es_agents.cli.base import cli, emit, emit_many, machine, output_option


@cli.command()
@click.option(
    "--partitions",
    type=int,
    default=None,
    help="Partitions of topics created now (default ES_AGENTS_PARTITIONS); "
    "existing topics keep theirs.",
)
@click.option(
    "--fix-retention",
    is_flag=True,
    help="Make existing topics keep every record (retention.ms=-1, "
    "retention.bytes=-1) instead of refusing them.",
)
@output_option
def topics(partitions: int | None, fix_retention: bool) -> None:
    """Create the commands, events and DLQ topics (idempotent) and check them:
    retention forever, commands and events with the same partition count; and the
    answers' stream (kept an hour). On the Postgres store: the tables and the
    topics' partitions."""
    from es_agents.app import ensure_topics  # noqa: PLC0415
    from es_agents.settings import load_settings  # noqa: PLC0415

    overrides = {} if partitions is None else {"partitions": partitions}
    settings = load_settings(**overrides)
    counts = ensure_topics(settings, fix_retention=fix_retention)
    if machine():
        emit_many(
            {"topic": topic, "partitions": count, "retention": "forever"}
            for topic, count in counts.items()
        )
        return
    for topic, count in counts.items():
        click.echo(f"{topic}: {count} partitions, retention forever")


@cli.command()
@click.option("--agent", "agent_spec", required=True, help="module:attr of the agent.")
@click.option("--group", default=None, help="Consumer group (default PREFIX.workers).")
@click.option(
    "--instance-id",
    default=None,
    help="Static group membership: a restarted worker takes its partitions "
    "back at once instead of waiting for the session timeout.",
)
@click.option(
    "--until-idle",
    is_flag=True,
    help="Exit when no run is active and no command came for --idle seconds.",
)
@click.option("--idle", type=float, default=1.0, show_default=True)
@click.option(
    "--calls",
    "--threads",
    "threads",
    type=click.IntRange(1),
    default=None,
    help="Tool and model calls the worker makes at once, over all its runs "
    "(default ES_AGENTS_TOOL_CALLS_PER_WORKER, 64). Runs themselves are not "
    "bounded: each is a task on the worker's event loop.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Serve Prometheus metrics on this port (ES_AGENTS_METRICS_PORT).",
)
def worker(  # noqa: PLR0917 - click passes options positionally
    agent_spec: str,
    group: str | None,
    instance_id: str | None,
    until_idle: bool,
    idle: float,
    threads: int | None,
    metrics_port: int | None,
) -> None:
    """Consume commands and drive the runs of the owned partitions."""
    import logging  # noqa: PLC0415
    import os  # noqa: PLC0415
    import signal  # noqa: PLC0415
    import threading  # noqa: PLC0415

    # First of all: a SIGTERM while the worker starts (imports, connections) is a
    # clean leave too, not death by the default action.
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())

    from es_agents.agent import load_agent  # noqa: PLC0415
    from es_agents.app import build_worker  # noqa: PLC0415
    from es_agents.log_format import configure  # noqa: PLC0415
    from es_agents.settings import load_settings  # noqa: PLC0415

    configure(logging.INFO)  # JSON lines when stderr is not a terminal
    logging.getLogger("es_agents.librdkafka").setLevel(logging.ERROR)
    import faulthandler  # noqa: PLC0415

    faulthandler.register(
        signal.SIGUSR1
    )  # `kill -USR1 PID` prints every thread's stack
    sys.path.insert(0, os.getcwd())  # agents usually live in the project, like app dirs
    agent = load_agent(agent_spec)
    settings = load_settings(
        **({} if metrics_port is None else {"metrics_port": metrics_port})
    )
    w = build_worker(
        settings,
        agent,
        group_id=group,
        instance_id=instance_id,
        until_idle=until_idle,
        idle_seconds=idle,
        threads=threads,
    )
    signal.signal(signal.SIGTERM, lambda *_: w.stop())
    if stopping.is_set():
        w.stop()  # asked to leave while starting: run() returns at once
    click.echo(
        f"worker for agent {agent.name!r} on {settings.kafka.commands_topic} "
        f"({settings.store})",
        err=True,
    )
    w.run()


@cli.command()
@click.option("--agent", "agent_spec", required=True, help="module:attr of the agent.")
@click.option(
    "--no-projector",
    is_flag=True,
    help="The worker only (a projector runs elsewhere).",
)
@click.option(
    "--instance-id",
    default=None,
    help="Static group membership for the worker (WORKER) and the projector "
    "(WORKER-projector).",
)
def serve(agent_spec: str, no_projector: bool, instance_id: str | None) -> None:
    """A worker for AGENT and a projector, kept running: each restarts after it
    lost Kafka or Postgres (with a backoff), everything stops on a configuration
    error or SIGTERM. One line per change of state."""
    import logging  # noqa: PLC0415

    from es_agents.log_format import configure  # noqa: PLC0415
    from es_agents.supervisor import Supervisor, cli_child  # noqa: PLC0415

    configure(logging.INFO)
    member = ["--instance-id", instance_id] if instance_id else []
    children = [cli_child("worker", ["worker", "--agent", agent_spec, *member])]
    if not no_projector:
        own = ["--instance-id", f"{instance_id}-projector"] if instance_id else []
        children.append(cli_child("projector", ["projector", *own]))
    sys.exit(Supervisor(children).run())


@cli.command()
@click.option(
    "--until-caught-up",
    is_flag=True,
    help="Exit once every assigned partition is projected to its end.",
)
@click.option("--batch", type=int, default=2000, show_default=True)
@click.option(
    "--instance-id",
    default=None,
    help="Static group membership: a restarted projector takes its partitions "
    "back at once.",
)
@click.option(
    "--rebuild",
    is_flag=True,
    help="Empty the projections (runs, run_events, run_snapshots, dead_letters) "
    "and project the whole log again. Stop other projectors first. Refused "
    "(exit 2) when the database also holds another prefix's projections.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Serve Prometheus metrics on this port (ES_AGENTS_METRICS_PORT).",
)
def projector(
    until_caught_up: bool,
    batch: int,
    instance_id: str | None,
    rebuild: bool,
    metrics_port: int | None,
) -> None:
    """Project the events into runs, run_events and run_snapshots, exactly once."""
    import logging  # noqa: PLC0415
    import signal  # noqa: PLC0415

    from es_agents.app import build_projector  # noqa: PLC0415
    from es_agents.log_format import configure  # noqa: PLC0415
    from es_agents.settings import load_settings  # noqa: PLC0415

    configure(logging.INFO)  # JSON lines when stderr is not a terminal
    logging.getLogger("es_agents.librdkafka").setLevel(logging.ERROR)
    settings = load_settings(
        **({} if metrics_port is None else {"metrics_port": metrics_port})
    )
    p = build_projector(settings, batch_size=batch, instance_id=instance_id)
    if rebuild:
        p.reset()
        click.echo("projections emptied: projecting the log from its start", err=True)
    signal.signal(signal.SIGTERM, lambda *_: p.stop())
    p.run(until_caught_up=until_caught_up)
    click.echo(f"projected {p.projected} events", err=True)


@cli.command()
@click.option(
    "--print", "print_only", is_flag=True, help="Show the SQL, apply nothing."
)
@output_option
def migrate(print_only: bool) -> None:
    """Apply the SQL migrations in projectors/sql to ES_AGENTS_DATABASE_URL."""
    from es_agents.app import migrate as apply  # noqa: PLC0415
    from es_agents.settings import load_settings  # noqa: PLC0415

    todo = apply(load_settings(), dry_run=print_only)
    if machine():
        emit(
            {
                "applied": [] if print_only else [m.version for m in todo],
                "pending": [m.version for m in todo] if print_only else [],
                "migrations": [
                    {"version": m.version, "name": m.name}
                    | ({"sql": m.sql} if print_only else {})
                    for m in todo
                ],
            }
        )
        return
    for migration in todo:
        if print_only:
            click.echo(
                f"-- {migration.version:04d}_{migration.name}.sql\n{migration.sql}"
            )
        else:
            click.echo(f"applied {migration.version:04d}_{migration.name}")
    if not todo:
        click.echo("nothing to apply")
