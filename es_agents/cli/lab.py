"""Lab commands: ``bench ...`` and ``demo`` (code in ``es_agents.lab``)."""

from __future__ import annotations

import sys

import click

from es_agents.cli.base import cli


@cli.group()
def bench() -> None:
    """Benchmarks that print figures (medians and ratios from one run)."""


@bench.command("steps")
@click.option("--steps", type=int, default=1000, show_default=True)
@click.option(
    "--fsync",
    is_flag=True,
    help="Topics with flush.messages=1: the broker fsyncs each message first.",
)
def bench_steps_command(steps: int, fsync: bool) -> None:
    """Per-step cost of the protocol vs raw produce+flush, and log bytes per step."""
    import logging  # noqa: PLC0415

    from es_agents.lab.bench import bench_steps  # noqa: PLC0415

    logging.getLogger("es_agents.runtime.worker").setLevel(logging.WARNING)
    bench_steps(steps, click.echo, fsync=fsync)


@bench.command("parallel")
@click.option("--calls", type=int, default=10, show_default=True)
@click.option("--latency-ms", type=float, default=100, show_default=True)
@click.option("--repeats", type=int, default=5, show_default=True)
def bench_parallel_command(calls: int, latency_ms: float, repeats: int) -> None:
    """One step with --calls concurrent tool calls of --latency-ms each."""
    import logging  # noqa: PLC0415

    from es_agents.lab.bench_parallel import bench_parallel  # noqa: PLC0415

    logging.getLogger("es_agents.runtime.worker").setLevel(logging.WARNING)
    bench_parallel(calls, latency_ms, repeats, click.echo)


@bench.command("stream")
@click.option("--runs", type=int, default=20, show_default=True)
@click.option("--pieces", type=int, default=20, show_default=True)
@click.option("--gap-ms", type=float, default=20, show_default=True)
@click.option("--cpu-runs", type=int, default=100, show_default=True)
@click.option("--repeats", type=int, default=3, show_default=True)
def bench_stream_command(
    runs: int, pieces: int, gap_ms: float, cpu_runs: int, repeats: int
) -> None:
    """Streamed answers: server write to follower (p50, p95), and the worker's CPU
    per model call not streamed, streamed, and streamed with publishing."""
    import logging  # noqa: PLC0415

    from es_agents.lab.bench_stream import bench_stream  # noqa: PLC0415

    logging.getLogger("es_agents.runtime.worker").setLevel(logging.WARNING)
    bench_stream(runs, pieces, gap_ms, cpu_runs, repeats, click.echo)


@bench.command("resume")
@click.option("--lengths", default="10,1000,10000,100000", show_default=True)
@click.option("--repeats", type=int, default=7, show_default=True)
@click.option("-k", "--snapshot-every", "k", type=int, default=100, show_default=True)
def bench_resume_command(lengths: str, repeats: int, k: int) -> None:
    """Resume time (command to next step) for runs of very different lengths."""
    import logging  # noqa: PLC0415

    from es_agents.lab.bench import bench_resume  # noqa: PLC0415

    logging.getLogger("es_agents.runtime.worker").setLevel(logging.WARNING)
    logging.getLogger("projectors.runs").setLevel(logging.WARNING)
    bench_resume([int(n) for n in lengths.split(",")], repeats, k, click.echo)


@bench.command("projector")
@click.option("--runs", type=int, default=50, show_default=True)
@click.option("--seconds", type=float, default=10, show_default=True)
def bench_projector_command(runs: int, seconds: float) -> None:
    """Projection lag under load; projector vs bare consumer events/s."""
    import logging  # noqa: PLC0415

    from es_agents.lab.bench_projector import bench_projector  # noqa: PLC0415

    logging.getLogger("projectors.runs").setLevel(logging.WARNING)
    bench_projector(runs, seconds, click.echo)


@bench.command("commands")
@click.option("--events", type=int, default=1_000_000, show_default=True)
@click.option("--repeats", type=int, default=15, show_default=True)
@click.option("--cli-repeats", type=int, default=3, show_default=True)
def bench_commands_command(events: int, repeats: int, cli_repeats: int) -> None:
    """Command latencies (client and CLI) on a small and on a large topic."""
    import logging  # noqa: PLC0415

    from es_agents.lab.bench_commands import bench_commands  # noqa: PLC0415

    logging.getLogger("es_agents.runtime.worker").setLevel(logging.WARNING)
    logging.getLogger("es_agents.runtime.run_loop").setLevel(logging.WARNING)
    logging.getLogger("projectors.runs").setLevel(logging.WARNING)
    bench_commands(events, repeats, cli_repeats, click.echo)


@bench.command("audit")
@click.option("--events", type=int, default=1_000_000, show_default=True)
def bench_audit_command(events: int) -> None:
    """The whole-topic audit's events/s vs a bare reader, on a scratch topic."""
    from es_agents.lab.bench_audit import bench_audit  # noqa: PLC0415

    bench_audit(events, click.echo)


@bench.command("fork")
@click.option("--events", type=int, default=10_000, show_default=True)
@click.option("--repeats", type=int, default=5, show_default=True)
def bench_fork_command(events: int, repeats: int) -> None:
    """The time to fork a run of --events events, on a scratch topic."""
    from es_agents.lab.bench_fork import bench_fork  # noqa: PLC0415

    bench_fork(events, repeats, click.echo)


@bench.command("throughput")
@click.option(
    "--runs",
    default="1,10,100,1000",
    show_default=True,
    help="Concurrent runs per round, comma-separated.",
)
@click.option("--steps", type=int, default=50, show_default=True)
@click.option("--partitions", type=int, default=4, show_default=True)
@click.option(
    "--workers",
    "scale",
    default="2",
    show_default=True,
    help="Worker processes to scale to at the largest round, comma-separated "
    "(e.g. 2,4); each is compared with one.",
)
def bench_throughput_command(
    runs: str, steps: int, partitions: int, scale: str
) -> None:
    """Steps/s, events/s, CPU per step and RSS of worker processes with many
    concurrent runs, vs a bare producer; then more workers (the scaling ratios)."""
    from es_agents.lab.bench_throughput import bench_throughput  # noqa: PLC0415

    counts = [int(n) for n in runs.split(",") if n.strip()]
    workers = [int(n) for n in scale.split(",") if n.strip()]
    bench_throughput(counts, steps, partitions, click.echo, workers)


@bench.command("takeover")
@click.option("--paused", type=int, default=1000, show_default=True)
@click.option("--active", type=int, default=100, show_default=True)
@click.option("--partitions", type=int, default=4, show_default=True)
@click.option(
    "--session-timeout",
    type=int,
    default=10_000,
    show_default=True,
    help="The workers' group session timeout, ms (the framework's default is 45000).",
)
@click.option(
    "--approvals",
    type=int,
    default=10,
    show_default=True,
    help="Paused runs approved after each takeover (their latency).",
)
def bench_takeover_command(
    paused: int, active: int, partitions: int, session_timeout: int, approvals: int
) -> None:
    """A worker SIGKILLed with paused and active runs on its partitions: how long
    until a restarted one (same instance id) and a new one (another) serve them."""
    from es_agents.lab.bench_takeover import bench_takeover  # noqa: PLC0415

    bench_takeover(paused, active, partitions, session_timeout, approvals, click.echo)


@bench.command("flow")
@click.option("--runs", type=int, default=1000, show_default=True)
@click.option("--limit", type=int, default=10, show_default=True)
@click.option(
    "--high-every",
    type=int,
    default=10,
    show_default=True,
    help="Every n-th start has priority 1, the others 0 (0: all 0).",
)
@click.option("--partitions", type=int, default=4, show_default=True)
@click.option(
    "--kill/--no-kill",
    default=True,
    show_default=True,
    help="SIGKILL one of the two workers once a third of the runs completed.",
)
def bench_flow_command(
    runs: int, limit: int, high_every: int, partitions: int, kill: bool
) -> None:
    """Starts against a limit of active runs: the most active at once (from the
    log and sampled), queue order, every run completed once, across a worker kill."""
    from es_agents.lab.bench_flow import bench_flow  # noqa: PLC0415

    summary = bench_flow(runs, limit, high_every, partitions, kill, click.echo)
    broken = (
        summary["completed"] != runs
        or summary["started_twice"]
        or int(str(summary["most_active_from_log"])) > limit
        or int(str(summary["most_places_sampled"])) > limit
    )
    if broken:
        raise SystemExit(1)


@bench.command("upgrade")
@click.option("--runs", type=int, default=10_000, show_default=True)
@click.option("--length", type=int, default=10, show_default=True,
              help="Events of each run.")  # fmt: skip
@click.option("--partitions", type=int, default=4, show_default=True)
def bench_upgrade_command(runs: int, length: int, partitions: int) -> None:
    """`upgrade check` over many paused runs: with the code that started them and
    with a fold rule changed (exit 1 unless the first passes every run and the
    second names every run)."""
    from es_agents.lab.bench_upgrade import bench_upgrade  # noqa: PLC0415

    summary = bench_upgrade(runs, length, partitions, click.echo)
    if summary["differ_same_code"] or summary["differ_changed_fold"] != runs:
        raise SystemExit(1)


@bench.command("growth")
@click.option("--chat-steps", type=click.IntRange(min=8), default=10_000,
              show_default=True)  # fmt: skip
@click.option("--tool-calls", type=click.IntRange(min=4), default=100,
              show_default=True)  # fmt: skip
@click.option("--resumes", type=click.IntRange(min=1), default=5, show_default=True,
              help="Resumes timed (fewer when the run is short).")  # fmt: skip
def bench_growth_command(chat_steps: int, tool_calls: int, resumes: int) -> None:
    """Log and Postgres bytes per step early and late in a long run, snapshot size,
    and resume at the end: a chat agent and one whose tools return 5 KB."""
    import logging  # noqa: PLC0415

    from es_agents.lab.bench_growth import bench_growth  # noqa: PLC0415

    logging.getLogger("es_agents.runtime.worker").setLevel(logging.WARNING)
    logging.getLogger("projectors.runs").setLevel(logging.WARNING)
    bench_growth(chat_steps, tool_calls, resumes, click.echo)


@bench.command("idle")
@click.option("--paused", type=int, default=10_000, show_default=True)
@click.option("--idle", "idle_seconds", type=float, default=10, show_default=True)
@click.option("--timers", type=int, default=100_000, show_default=True)
@click.option(
    "--rate", type=float, default=2000, show_default=True, help="Timers due per s."
)
def bench_idle_command(
    paused: int, idle_seconds: float, timers: int, rate: float
) -> None:
    """A worker's memory and CPU with many paused runs; timers fired on time."""
    import logging  # noqa: PLC0415

    from es_agents.lab.bench_idle import bench_idle  # noqa: PLC0415

    logging.getLogger("projectors.runs").setLevel(logging.WARNING)
    bench_idle(paused, idle_seconds, timers, rate, click.echo)


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

    from es_agents.lab.chaos.harness import ChaosConfig, bench_chaos  # noqa: PLC0415

    logging.basicConfig(level=logging.WARNING)
    # The broker going away is the point here: its clients' complaints are not news.
    logging.getLogger("es_agents.librdkafka").setLevel(logging.CRITICAL)
    logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)
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
    from es_agents.lab.demo import run_demo  # noqa: PLC0415

    if not run_demo(echo=click.echo):
        sys.exit(1)
