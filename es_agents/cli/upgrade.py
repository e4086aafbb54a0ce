"""``es-agents upgrade check --agent module:attr``: before a deploy, what the new
code would do with every run of the agent that is not finished
(``es_agents.upgrade``). Exit 1 when a run would be refused or folds otherwise than
its projection, so CI can stop the deploy."""

from __future__ import annotations

import os
import sys
from dataclasses import asdict
from typing import TYPE_CHECKING

import click

from es_agents.cli.base import EXIT_REFUSED, cli, emit, machine, output_option, table
from es_agents.cli.commands import client

if TYPE_CHECKING:
    from es_agents.upgrade import RunVerdict


@cli.group()
def upgrade() -> None:
    """Check new code against the runs in flight before it ships."""


@upgrade.command("check")
@click.option(
    "--agent", "agent_spec", required=True, help="module:attr of the new code."
)
@click.option("--limit", type=click.IntRange(min=1), default=100_000, show_default=True,
              help="Runs of each status to check at most.")  # fmt: skip
@output_option
def upgrade_check(agent_spec: str, limit: int) -> None:
    """For each running, paused or blocked run of the agent: the version gate's
    verdict under this code (same, verbatim, migrate, refuse) and whether this
    code folds its log as its projection says. Exit 1 on a refusal or a
    difference (as of the projector: run it first)."""
    from es_agents.agent import load_agent  # noqa: PLC0415
    from es_agents.upgrade import check  # noqa: PLC0415

    sys.path.insert(0, os.getcwd())  # agents usually live in the project
    agent = load_agent(agent_spec)
    with client() as c:
        verdicts = list(check(c, agent, limit))
    failing = [v for v in verdicts if v.fails]
    counts: dict[str, int] = {}
    for v in verdicts:
        counts[v.decision] = counts.get(v.decision, 0) + 1
    if machine():
        emit(
            {
                "agent": agent.name,
                "runs": len(verdicts),
                "decisions": counts,
                "failing": len(failing),
                "verdicts": [asdict(v) for v in verdicts],
            }
        )
    else:
        rows: list[dict[str, object]] = [
            {
                "run_id": v.run_id,
                "status": v.status,
                "decision": v.decision,
                "why": v.reason or ", ".join(sorted(v.changed)) or "-",
                "fold": v.differs or "as projected",
            }
            for v in verdicts
        ]
        if rows:
            table(rows, ["run_id", "status", "decision", "why", "fold"])
        summary = ", ".join(f"{n} {d}" for d, n in sorted(counts.items())) or "none"
        click.echo(
            f"{len(verdicts)} runs of {agent.name!r} not finished: {summary}; "
            f"{len(failing)} would not go on as they are",
            err=True,
        )
        if failing and all(_only_the_reducer(v) for v in failing):
            click.echo(
                "only the reducer version changed, and every run folds as "
                "projected: the fold's code changed but not what it does for these "
                "runs; VersionPolicy(reducer_version='allow') lets them go on",
                err=True,
            )
    if failing:
        sys.exit(EXIT_REFUSED)


def _only_the_reducer(verdict: RunVerdict) -> bool:
    """Refused for the reducer version alone, with a fold that agrees."""
    return (
        verdict.decision == "refuse"
        and verdict.differs is None
        and set(verdict.changed) - {"code_revision", "prompt_hash", "model_id"}
        == {"reducer_version"}
    )
