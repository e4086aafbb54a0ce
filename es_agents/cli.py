"""``es-agents``: the command line for people and scripts."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import click

from es_agents.errors import ConfigError, EsAgentsError, Unavailable

if TYPE_CHECKING:
    from es_agents.client import Client, CommandResult
    from es_agents.core import Command, RunState

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
def topics(partitions: int | None, fix_retention: bool) -> None:
    """Create the commands, events and DLQ topics (idempotent) and check them:
    retention forever, commands and events with the same partition count."""
    from es_agents.adapters.kafka import ensure_topics  # noqa: PLC0415
    from es_agents.settings import load_settings  # noqa: PLC0415

    overrides = {} if partitions is None else {"partitions": partitions}
    settings = load_settings(**overrides).kafka
    counts = ensure_topics(settings, fix_retention=fix_retention)
    for topic, count in counts.items():
        click.echo(f"{topic}: {count} partitions, retention forever")


@cli.command()
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per event.")
@click.option(
    "--record",
    "record_to",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also write the run's raw events and final state to this file "
    "(a recorded history for tests/histories/).",
)
def replay(run_id: str, as_json: bool, record_to: str | None) -> None:
    """Read a run's events from the log (an audit) and print the folded state."""
    from es_agents.adapters.kafka import KafkaEventLog  # noqa: PLC0415
    from es_agents.app import build_claim_check  # noqa: PLC0415
    from es_agents.core import replay as fold_all  # noqa: PLC0415
    from es_agents.settings import load_settings  # noqa: PLC0415

    settings = load_settings()
    claims = build_claim_check(settings)  # payloads are read back and hash-checked
    log = KafkaEventLog(settings.kafka, restore=claims.restore if claims else None)
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
    if record_to is not None:
        import base64  # noqa: PLC0415
        import json as json_module  # noqa: PLC0415
        from pathlib import Path  # noqa: PLC0415

        from es_agents.codec import AvroCodec  # noqa: PLC0415
        from es_agents.core.snapshot import to_snapshot  # noqa: PLC0415

        codec = AvroCodec()
        history = {
            "run_id": run_id,
            "events": [base64.b64encode(codec.encode(e)).decode() for e in events],
            "final": to_snapshot(state),
        }
        Path(record_to).write_text(json_module.dumps(history, indent=1) + "\n")
    if not as_json:
        click.echo(f"status={state.status} step={state.step} events={state.seq + 1}")


def _client() -> Client:
    from es_agents.client import Client  # noqa: PLC0415

    return Client()


def wait_options(fn: F) -> F:
    """--wait / --no-wait: how long to wait for the worker's verdict."""
    fn = click.option(
        "--no-wait",
        is_flag=True,
        help="Do not wait for the worker's verdict (the command is queued).",
    )(fn)
    return click.option(
        "--wait",
        "wait_seconds",
        type=float,
        default=10.0,
        show_default=True,
        help="Seconds to wait for the worker's verdict.",
    )(fn)


def _report(result: CommandResult, as_json: bool, quiet_applied: bool = False) -> None:
    """Print a command's fate; exit 1 when it was refused."""
    if as_json:
        _echo_json(
            {
                "command": result.command.wire_name,
                "command_id": result.command.command_id,
                "run_id": result.run_id,
                "status": result.status,
                "reason": result.reason,
            }
        )
    elif not (quiet_applied and result.status == "applied"):
        what = f"{result.command.wire_name} {result.run_id}: {result.status}"
        click.echo(what + (f" ({result.reason})" if result.reason else ""), err=True)
    if result.status == "refused":
        sys.exit(1)


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
    "--threads",
    type=int,
    default=64,
    show_default=True,
    help="Runs that can take steps at the same time.",
)
def worker(  # noqa: PLR0917 - click passes options positionally
    agent_spec: str,
    group: str | None,
    instance_id: str | None,
    until_idle: bool,
    idle: float,
    threads: int,
) -> None:
    """Consume commands and drive the runs of the owned partitions."""
    import logging  # noqa: PLC0415
    import os  # noqa: PLC0415
    import signal  # noqa: PLC0415

    from es_agents.adapters.kafka import ensure_topics  # noqa: PLC0415
    from es_agents.agent import load_agent  # noqa: PLC0415
    from es_agents.settings import load_settings  # noqa: PLC0415
    from es_agents.worker import Worker  # noqa: PLC0415

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("es_agents.librdkafka").setLevel(logging.ERROR)
    import faulthandler  # noqa: PLC0415

    faulthandler.register(
        signal.SIGUSR1
    )  # `kill -USR1 PID` prints every thread's stack
    sys.path.insert(0, os.getcwd())  # agents usually live in the project, like app dirs
    agent = load_agent(agent_spec)
    settings = load_settings()
    ensure_topics(settings.kafka)
    w = Worker(
        settings,
        agent,
        group_id=group,
        instance_id=instance_id,
        until_idle=until_idle,
        idle_seconds=idle,
        threads=threads,
    )
    signal.signal(signal.SIGTERM, lambda *_: w.stop())
    click.echo(
        f"worker for agent {agent.name!r} on {settings.kafka.commands_topic}", err=True
    )
    w.run()


@cli.command("start")
@click.argument("agent")
@click.option(
    "--input",
    "input_json",
    default="{}",
    show_default=True,
    help="The run's input as JSON.",
)
@click.option("--run-id", default=None, help="Default: a new UUID.")
@wait_options
@click.option("--json", "as_json", is_flag=True)
def start_run(  # noqa: PLR0917 - click passes options positionally
    agent: str,
    input_json: str,
    run_id: str | None,
    wait_seconds: float,
    no_wait: bool,
    as_json: bool,
) -> None:
    """Start a run of AGENT; prints the run id, then what became of the start."""
    _require_json(input_json, "--input")
    with _client() as client:
        result = client.start(
            agent, input_json, run_id, wait=0 if no_wait else wait_seconds
        )
    if not as_json and result.status != "refused":
        click.echo(result.run_id)
    _report(result, as_json, quiet_applied=True)


def _require_json(text: str, option: str) -> None:
    try:
        json.loads(text)
    except ValueError as e:
        raise click.BadParameter(f"not JSON: {e}", param_hint=option) from e


def _decide(
    command: Command, wait_seconds: float, no_wait: bool, as_json: bool
) -> None:
    with _client() as client:
        result = client.send(command, wait=0 if no_wait else wait_seconds)
    _report(result, as_json)


@cli.command()
@click.argument("run_id")
@click.option("--by", required=True, help="Who approves.")
@click.option("--gate", default=None, help="Approve a named gate ahead of time.")
@click.option("--comment", default=None)
@wait_options
@click.option("--json", "as_json", is_flag=True)
def approve(  # noqa: PLR0917 - click passes options positionally
    run_id: str,
    by: str,
    gate: str | None,
    comment: str | None,
    wait_seconds: float,
    no_wait: bool,
    as_json: bool,
) -> None:
    """Approve the gate RUN waits at (or --gate, ahead of time)."""
    from es_agents.core.commands import Approve  # noqa: PLC0415

    command = Approve(run_id=run_id, by=by, gate=gate, comment=comment)
    _decide(command, wait_seconds, no_wait, as_json)


@cli.command()
@click.argument("run_id")
@click.option("--by", required=True, help="Who rejects.")
@click.option("--gate", default=None, help="Reject a named gate ahead of time.")
@click.option("--reason", default=None)
@wait_options
@click.option("--json", "as_json", is_flag=True)
def reject(  # noqa: PLR0917 - click passes options positionally
    run_id: str,
    by: str,
    gate: str | None,
    reason: str | None,
    wait_seconds: float,
    no_wait: bool,
    as_json: bool,
) -> None:
    """Reject the gate RUN waits at (or --gate, ahead of time)."""
    from es_agents.core.commands import Reject  # noqa: PLC0415

    command = Reject(run_id=run_id, by=by, gate=gate, reason=reason)
    _decide(command, wait_seconds, no_wait, as_json)


@cli.command("provide-input")
@click.argument("run_id")
@click.option("--by", required=True)
@click.option("--input", "input_json", required=True, help="JSON.")
@wait_options
@click.option("--json", "as_json", is_flag=True)
def provide_input(  # noqa: PLR0917 - click passes options positionally
    run_id: str,
    by: str,
    input_json: str,
    wait_seconds: float,
    no_wait: bool,
    as_json: bool,
) -> None:
    """Give RUN the input it waits for (or settle an uncertain effect's result)."""
    from es_agents.core.commands import ProvideInput  # noqa: PLC0415

    _require_json(input_json, "--input")
    command = ProvideInput(run_id=run_id, by=by, input_json=input_json)
    _decide(command, wait_seconds, no_wait, as_json)


@cli.command()
@click.argument("run_id")
@click.option("--by", required=True)
@click.option("--reason", default=None)
@wait_options
@click.option("--json", "as_json", is_flag=True)
def cancel(  # noqa: PLR0917 - click passes options positionally
    run_id: str,
    by: str,
    reason: str | None,
    wait_seconds: float,
    no_wait: bool,
    as_json: bool,
) -> None:
    """Stop RUN for good (status cancelled)."""
    from es_agents.core.commands import Cancel  # noqa: PLC0415

    command = Cancel(run_id=run_id, by=by, reason=reason)
    _decide(command, wait_seconds, no_wait, as_json)


def _summary(state: RunState) -> dict[str, object]:
    waiting = state.waiting
    return {
        "run_id": state.run_id,
        "agent": state.agent,
        "status": state.status,
        "step": state.step,
        "events": state.seq + 1,
        "waiting": waiting.reason if waiting else None,
        "gate": waiting.gate if waiting else None,
        "wake_at": waiting.wake_at if waiting else None,
        "pending": type(state.pending).__name__ if state.pending else None,
        "model_calls": state.model_calls,
        "model_attempts": state.model_attempts,
        "tool_calls": state.tool_calls,
        "reconciled_calls": state.reconciled_calls,
        "tokens": state.prompt_tokens + state.completion_tokens,
        "output": state.output_json,
        "error": state.error,
        "started_at": state.started_at,
        "updated_at": state.updated_at,
        "last_gate": state.last_gate,
        "versions": {
            "agent_version": state.versions.agent_version,
            "code_revision": state.versions.code_revision,
            "prompt_hash": state.versions.prompt_hash,
            "model_id": state.versions.model_id,
            "tools_hash": state.versions.tools_hash,
            "reducer_version": state.versions.reducer_version,
        },
    }


@cli.command()
@click.argument("run_id")
@click.option("--json", "as_json", is_flag=True)
def status(run_id: str, as_json: bool) -> None:
    """A run's status, step, what it waits for, its versions, and the commands
    refused for it. A run whose start waits for a worker is ``pending``.

    Read like a worker resumes it: the latest snapshot in Postgres, the projected
    events after it, and the log beyond the projector's offset.
    """
    with _client() as client:
        view = client.status(run_id)
    summary: dict[str, object] = (
        _summary(view.state)
        if view.state is not None
        else {"run_id": run_id, "agent": view.agent, "status": view.status}
    )
    if view.refused:
        summary["refused_commands"] = [
            {"command": v.type, "command_id": v.command_id, "reason": v.reason}
            for v in view.refused
        ]
    if view.dead_letters:
        summary["dead_letters"] = [
            {"topic": t, "partition": p, "offset": o, "reason": r}
            for t, p, o, r in view.dead_letters
        ]
    if view.loaded_from:
        summary["loaded_from"] = view.loaded_from
    if view.payload_problem:
        summary["payload_problem"] = view.payload_problem
    if as_json:
        _echo_json(summary)
        return
    for key, value in summary.items():
        if value not in (None, "", {}, []):
            click.echo(f"{key:>16}: {value}")


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
    "and project the whole log again. Stop other projectors first.",
)
def projector(
    until_caught_up: bool, batch: int, instance_id: str | None, rebuild: bool
) -> None:
    """Project es.events into runs, run_events and run_snapshots, exactly once."""
    import logging  # noqa: PLC0415
    import signal  # noqa: PLC0415

    from es_agents.adapters.kafka import ensure_topics  # noqa: PLC0415
    from es_agents.settings import load_settings  # noqa: PLC0415
    from projectors.runs import Projector  # noqa: PLC0415

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("es_agents.librdkafka").setLevel(logging.ERROR)
    settings = load_settings()
    ensure_topics(settings.kafka)
    p = Projector(settings, batch_size=batch, instance_id=instance_id)
    if rebuild:
        p.reset()
        click.echo("projections emptied: projecting the log from its start", err=True)
    signal.signal(signal.SIGTERM, lambda *_: p.stop())
    p.run(until_caught_up=until_caught_up)
    click.echo(f"projected {p.projected} events", err=True)


@cli.command()
@click.option(
    "--status",
    "status_filter",
    type=click.Choice(
        ["running", "paused", "blocked", "completed", "failed", "cancelled"]
    ),
)
@click.option("--json", "as_json", is_flag=True)
def runs(status_filter: str | None, as_json: bool) -> None:
    """Runs from the `runs` table (as of the projector), optionally by status."""
    from es_agents.adapters.postgres import Database  # noqa: PLC0415
    from es_agents.settings import load_settings  # noqa: PLC0415

    db = Database(load_settings().database_url.get_secret_value(), max_size=2)
    try:
        db.migrate()
        with db.transaction() as conn:
            cur = conn.execute(
                "SELECT run_id, agent, status, step, last_seq + 1 AS events, "
                "waiting_reason, waiting_gate, updated_at FROM runs "
                "WHERE %(status)s::text IS NULL OR status = %(status)s "
                "ORDER BY updated_at DESC",
                {"status": status_filter},
            )
            names = [d.name for d in cur.description or []]
            rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    finally:
        db.close()
    if as_json:
        for row in rows:
            _echo_json(row)
        return
    _table(rows, names)


@cli.command()
@click.option(
    "--print", "print_only", is_flag=True, help="Show the SQL, apply nothing."
)
def migrate(print_only: bool) -> None:
    """Apply the SQL migrations in projectors/sql to ES_AGENTS_DATABASE_URL."""
    from es_agents.adapters.postgres import Database  # noqa: PLC0415
    from es_agents.settings import load_settings  # noqa: PLC0415

    db = Database(load_settings().database_url.get_secret_value())
    try:
        todo = db.migrate(dry_run=print_only)
    finally:
        db.close()
    for migration in todo:
        if print_only:
            click.echo(
                f"-- {migration.version:04d}_{migration.name}.sql\n{migration.sql}"
            )
        else:
            click.echo(f"applied {migration.version:04d}_{migration.name}")
    if not todo:
        click.echo("nothing to apply")


@cli.group()
def schemas() -> None:
    """The Avro schemas in schemas/."""


@schemas.command("check")
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False),
    default=None,
    help="Default: the schemas/ of this installation.",
)
def schemas_check(directory: str | None) -> None:
    """Fail when a schema cannot read what an earlier version of it wrote."""
    from pathlib import Path  # noqa: PLC0415

    from es_agents.codec import SCHEMAS_DIR  # noqa: PLC0415
    from es_agents.schemas import check  # noqa: PLC0415

    problems = check(Path(directory) if directory else SCHEMAS_DIR)
    for problem in problems:
        click.echo(f"incompatible: {problem}", err=True)
    if problems:
        sys.exit(1)
    click.echo("schemas: every version reads its earlier versions")


@cli.group()
def bench() -> None:
    """Benchmarks that print figures (medians and ratios from one run)."""


@bench.command("steps")
@click.option("--steps", type=int, default=1000, show_default=True)
def bench_steps_command(steps: int) -> None:
    """Per-step cost of the protocol vs raw produce+flush, and log bytes per step."""
    import logging  # noqa: PLC0415

    from es_agents.bench import bench_steps  # noqa: PLC0415

    logging.getLogger("es_agents.worker").setLevel(logging.WARNING)
    bench_steps(steps, click.echo)


@bench.command("resume")
@click.option("--lengths", default="10,1000,10000,100000", show_default=True)
@click.option("--repeats", type=int, default=7, show_default=True)
@click.option("-k", "--snapshot-every", "k", type=int, default=100, show_default=True)
def bench_resume_command(lengths: str, repeats: int, k: int) -> None:
    """Resume time (command to next step) for runs of very different lengths."""
    import logging  # noqa: PLC0415

    from es_agents.bench import bench_resume  # noqa: PLC0415

    logging.getLogger("es_agents.worker").setLevel(logging.WARNING)
    logging.getLogger("projectors.runs").setLevel(logging.WARNING)
    bench_resume([int(n) for n in lengths.split(",")], repeats, k, click.echo)


@bench.command("projector")
@click.option("--runs", type=int, default=50, show_default=True)
@click.option("--seconds", type=float, default=10, show_default=True)
def bench_projector_command(runs: int, seconds: float) -> None:
    """Projection lag under load; projector vs bare consumer events/s."""
    import logging  # noqa: PLC0415

    from es_agents.bench import bench_projector  # noqa: PLC0415

    logging.getLogger("projectors.runs").setLevel(logging.WARNING)
    bench_projector(runs, seconds, click.echo)


@bench.command("commands")
@click.option("--events", type=int, default=1_000_000, show_default=True)
@click.option("--repeats", type=int, default=15, show_default=True)
@click.option("--cli-repeats", type=int, default=3, show_default=True)
def bench_commands_command(events: int, repeats: int, cli_repeats: int) -> None:
    """Command latencies (client and CLI) on a small and on a large topic."""
    import logging  # noqa: PLC0415

    from es_agents.bench_commands import bench_commands  # noqa: PLC0415

    logging.getLogger("es_agents.worker").setLevel(logging.WARNING)
    logging.getLogger("es_agents.run_loop").setLevel(logging.WARNING)
    logging.getLogger("projectors.runs").setLevel(logging.WARNING)
    bench_commands(events, repeats, cli_repeats, click.echo)


@bench.command("chaos")
@click.option("--minutes", type=float, default=15, show_default=True)
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--workers", type=int, default=2, show_default=True)
@click.option("--partitions", type=int, default=4, show_default=True)
@click.option("--concurrency", type=int, default=30, show_default=True)
@click.option(
    "--mean-gap",
    type=float,
    default=9.0,
    show_default=True,
    help="Mean seconds between faults.",
)
@click.option(
    "--heal-seconds",
    type=float,
    default=180,
    show_default=True,
    help="Longest the heal phase may take before unsettled runs are violations.",
)
def bench_chaos_command(  # noqa: PLR0917 - click passes options positionally
    minutes: float,
    seed: int,
    workers: int,
    partitions: int,
    concurrency: int,
    mean_gap: float,
    heal_seconds: float,
) -> None:
    """Seeded faults on the dev stack, then invariant checks (exit 1 on a violation)."""
    import logging  # noqa: PLC0415

    from es_agents.chaos.harness import ChaosConfig, bench_chaos  # noqa: PLC0415

    logging.basicConfig(level=logging.WARNING)
    # The broker going away is the point here: its clients' complaints are not news.
    logging.getLogger("es_agents.librdkafka").setLevel(logging.CRITICAL)
    report = bench_chaos(
        ChaosConfig(
            minutes=minutes,
            seed=seed,
            workers=workers,
            partitions=partitions,
            concurrency=concurrency,
            mean_gap=mean_gap,
            heal_seconds=heal_seconds,
        ),
        click.echo,
    )
    if report["violations"]:
        sys.exit(1)


@cli.command()
def demo() -> None:
    """The research agent through an approval gate and a worker crash (real stack)."""
    from es_agents.demo import run_demo  # noqa: PLC0415

    if not run_demo(echo=click.echo):
        sys.exit(1)


def main() -> None:
    import logging  # noqa: PLC0415

    # librdkafka's own retries (coordinator loading, reconnects) are not news.
    logging.getLogger("es_agents.librdkafka").setLevel(logging.ERROR)
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
    except Unavailable as e:
        click.echo(f"unavailable: {e}", err=True)
        sys.exit(3)
    except EsAgentsError as e:
        click.echo(f"error: {type(e).__name__}: {e}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
