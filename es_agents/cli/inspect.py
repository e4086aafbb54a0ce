"""Looking at runs: ``status``, ``runs``, ``replay``, ``schemas``. Read commands
never change the database (no migrations)."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

import click

from es_agents.cli.base import (
    EXIT_REFUSED,
    ISO_TIME,
    OUTPUT,
    cli,
    complete_run_id,
    emit,
    emit_many,
    machine,
    output_option,
    table,
    text,
)
from es_agents.cli.commands import client
from es_agents.errors import NotFound

if TYPE_CHECKING:
    from es_agents.client import RunView
    from es_agents.core import RunState


def _family_lines(summary: Mapping[str, object]) -> list[str]:
    """A sub-agent's parent, a run's children."""
    out = []
    if summary["parent"]:
        out.append(f"parent: {summary['parent']}")
    children = summary["children"]
    if isinstance(children, list) and children:
        out.append(f"children: {' '.join(map(str, children))}")
    return out


def _pending(pending: object) -> str | None:
    """The call in flight: a tool call with its idempotency key, or a model call."""
    if pending is None:
        return None
    tool = getattr(pending, "tool", None)
    if tool is not None:
        return f"tool {tool} (key {getattr(pending, 'idempotency_key', '')})"
    return f"model call (attempt {getattr(pending, 'attempt', 1)})"


def _chain_line(breaks: list[str], head: str) -> str:
    if not breaks:
        return f"hash chain: intact, head {head[:16]}..."
    return f"hash chain: {len(breaks)} break(s)"


def _print_check(check: Any, summary: Mapping[str, object]) -> None:
    """``replay``'s report for people: the timeline, then what it found."""
    state = check.state
    for entry in check.timeline:
        click.echo(_timeline_line(entry))
    if state is not None:
        click.echo(f"status={state.status} step={state.step} events={state.seq + 1}")
    for line in _family_lines(summary):
        click.echo(line)
    for note in check.notes:
        click.echo(f"note: {note}")
    if check.events:
        click.echo(_chain_line(check.chain, check.head))
    click.echo(
        "projection: consistent with the log"
        if check.consistent
        else f"MISMATCH: {check.mismatch}"
    )


@cli.command()
@click.argument("run_id", shell_complete=complete_run_id)
@output_option
@click.option(
    "--record",
    "record_to",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also write the run's raw events and final state to this file "
    "(a recorded history for tests/histories/).",
)
def replay(run_id: str, record_to: str | None) -> None:
    """Read a run's events from the log, fold them with this code, print the
    timeline, and check the projection against the fold.

    Exit 0: the projection agrees with the log (or is behind it); 1: the first field
    that differs is printed; 3: the log has no such run. ``-o jsonl``: one object
    per event, then ``{"summary": ...}``; ``-o json``: ``{"events", "summary"}``.
    """
    from es_agents.app import build_client_ports  # noqa: PLC0415
    from es_agents.replay import check_run  # noqa: PLC0415
    from es_agents.run_tree import child_runs  # noqa: PLC0415
    from es_agents.settings import load_settings  # noqa: PLC0415
    from es_agents.vault import FORGOTTEN, Cipher  # noqa: PLC0415

    settings = load_settings()
    # Payloads are read back and hash-checked by the claim check.
    ports = build_client_ports(settings)
    try:
        cipher = Cipher(ports.vault)
        check = check_run(
            ports.log,
            ports.projections,
            run_id,
            settings.prices,
            lambda event: cipher.reveal(run_id, event),
        )
        if ports.vault.forgotten(run_id):
            check.notes.append(
                "forgotten: its data key was destroyed, so its payloads read "
                f"{FORGOTTEN!r}; its events, hashes and status are intact"
            )
    finally:
        ports.close()
    if not check.events and check.mismatch is None:
        raise NotFound(f"unknown run {run_id}: the log has no events for it")
    state = check.state
    summary = {
        "run_id": run_id,
        "status": state.status if state else None,
        "step": state.step if state else None,
        "events": len(check.events),
        "consistent": check.consistent,
        "mismatch": check.mismatch,
        "notes": check.notes,
        "chain": {"intact": not check.chain, "breaks": check.chain, "head": check.head},
        "parent": state.parent_run_id if state else None,
        "children": child_runs(check.events),
    }
    if OUTPUT.format == "jsonl":
        emit_many([*check.timeline, {"summary": summary}])
    elif machine():
        emit({"events": check.timeline, "summary": summary})
    else:
        _print_check(check, summary)
    if record_to is not None and state is not None:
        _record(run_id, check.events, state, record_to)
    if not check.consistent:
        sys.exit(EXIT_REFUSED)


@cli.command()
@click.option(
    "--since",
    type=ISO_TIME,
    default=None,
    help="Only runs with events at or after this UTC time (runs fold whole).",
)
@click.option("--run-prefix", default="", help="Only runs whose id starts so.")
@output_option
@click.option(
    "--report",
    "report_to",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also write the JSON report to this file.",
)
@click.option(
    "--bare/--no-bare",
    default=True,
    show_default=True,
    help="Time a bare reader of the same topic in the same run, for the ratio.",
)
def audit(
    since: datetime | None,
    run_prefix: str,
    report_to: str | None,
    bare: bool,
) -> None:
    """Read the whole events topic and check every run from the log alone: sequence
    gaps and duplicates, ledger claims without an outcome, the runs table against
    the fold; dangling intentions and waiting runs; and the cost ledger
    (ES_AGENTS_PRICES). Exit 1 when a check fails."""
    import json  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    from es_agents.app import build_client_ports  # noqa: PLC0415
    from es_agents.audit import audit as run_audit  # noqa: PLC0415
    from es_agents.retention import Retainer  # noqa: PLC0415
    from es_agents.settings import load_settings  # noqa: PLC0415

    settings = load_settings()
    ports = build_client_ports(settings)
    try:
        partitions = ports.log.partition_count()
        audited = run_audit(
            ports.log,
            ports.projections,
            ports.ledger,
            events_topic=settings.kafka.events_topic,
            partitions=partitions,
            prices=settings.prices,
            run_prefix=run_prefix,
            since=since,
            progress=lambda n, s: click.echo(
                f"... {n:,} events read ({n / s:,.0f}/s)", err=True
            ),
            purged=Retainer(ports, settings).checks(run_prefix),
            keyring=ports.keyring,
        )
        report = audited.to_json()
        # Forgotten runs are checked like the others: structure, hashes, status.
        report["forgotten"] = sorted(set(audited.runs) & ports.vault.forgotten_runs())
    finally:
        ports.close()
    report["store"] = settings.store
    if bare:
        from es_agents.lab.bare import bare_read  # noqa: PLC0415

        count, seconds = bare_read(settings, partitions)
        report["bare_events_per_s"] = round(count / max(seconds, 1e-9))
        report["ratio_audit_to_bare"] = round(
            report["events_per_s"] / max(report["bare_events_per_s"], 1), 3
        )
    if report_to is not None:
        Path(report_to).write_text(json.dumps(report, indent=1, default=str) + "\n")
    if machine():
        emit(report)
    else:
        _print_audit(report)
    if report["problem_count"]:
        sys.exit(EXIT_REFUSED)


def _print_audit(report: dict[str, Any]) -> None:
    cost = report["cost"]
    click.echo(
        f"{report['runs']} runs, {report['events']:,} events in {report['seconds']} s "
        f"({report['events_per_s']:,} events/s"
        + (
            f"; a bare reader {report['bare_events_per_s']:,}/s, ratio "
            f"{report['ratio_audit_to_bare']})"
            if "bare_events_per_s" in report
            else ")"
        )
    )
    click.echo(f"statuses: {report['statuses']}; waiting: {report['waiting']}")
    if report["forgotten"]:
        click.echo(
            f"forgotten: {len(report['forgotten'])} run(s) whose payloads were "
            "shredded (their structure, hash chains and status are checked)"
        )
    if report["fenced_writes_left_out"]:
        click.echo(
            f"{report['fenced_writes_left_out']} events written by fenced workers "
            "(after another worker claimed their partition) left out, as every "
            "reader does"
        )
    click.echo(
        f"cost: {cost['model_calls']} model calls, ${cost['total_usd']:.6f}"
        f" ({cost['unpriced_calls']} unpriced); resume read back "
        f"{cost['saved_by_resume_calls']} completions instead of asking again "
        f"(${cost['saved_by_resume_usd']:.6f} saved)"
    )
    for agent, values in cost["per_agent"].items():
        click.echo(f"  {agent}: {values}")
    for run_id, why in report["dangling_intentions"].items():
        click.echo(f"dangling: {run_id}: {why}")
    for run_id, problems in report["problems"].items():
        for problem in problems:
            click.echo(f"PROBLEM {run_id}: {problem}")
    click.echo(f"problems: {report['problem_count']}")


def _timeline_line(entry: dict[str, object]) -> str:
    fixed = ("seq", "step", "type", "at")
    extra = "  ".join(
        f"{k}={v}" for k, v in entry.items() if k not in fixed and v not in (None, [])
    )
    at = str(entry["at"])[11:23]
    return (
        f"{entry['seq']:>5} step {entry['step']:>4}  {entry['type']:<22} {at}  {extra}"
    ).rstrip()


def _record(run_id: str, events: list[Any], state: RunState, path: str) -> None:
    """A recorded history for tests/histories/: raw events and the final state."""
    import base64  # noqa: PLC0415
    import json  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    from es_agents.codec import AvroCodec  # noqa: PLC0415
    from es_agents.core.snapshot import to_snapshot  # noqa: PLC0415

    codec = AvroCodec()
    history = {
        "run_id": run_id,
        "events": [base64.b64encode(codec.encode(e)).decode() for e in events],
        "final": to_snapshot(state),
    }
    Path(path).write_text(json.dumps(history, indent=1) + "\n")


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
        "pending": _pending(state.pending),
        "model_calls": state.model_calls,
        "model_attempts": state.model_attempts,
        "tool_calls": state.tool_calls,
        "reconciled_calls": state.reconciled_calls,
        **({"turns": state.turns} if state.thread else {}),
        "tokens": state.prompt_tokens + state.completion_tokens,
        "output": state.output_json,
        "error": state.error,
        "started_at": state.started_at,
        "updated_at": state.updated_at,
        "last_gate": state.last_gate,
        "forked_from": (
            f"{state.origin_run}@{state.origin_seq}" if state.origin_run else None
        ),
        "versions": {
            "agent_version": state.versions.agent_version,
            "code_revision": state.versions.code_revision,
            "prompt_hash": state.versions.prompt_hash,
            "model_id": state.versions.model_id,
            "tools_hash": state.versions.tools_hash,
            "reducer_version": state.versions.reducer_version,
        },
    }


def _awaiting(state: RunState) -> dict[str, object] | None:
    """What a paused run waits on, as its interrupt described it: at a tool's
    gate, the pending call's tool and arguments (what an approval approves)."""
    import contextlib  # noqa: PLC0415
    import json  # noqa: PLC0415

    waiting = state.waiting
    if waiting is None:
        return None
    try:
        detail = json.loads(waiting.detail_json or "null")
    except ValueError:
        detail = waiting.detail_json
    if isinstance(detail, dict) and isinstance(detail.get("args_json"), str):
        with contextlib.suppress(ValueError):  # else shown as it was recorded
            detail["args"] = json.loads(str(detail["args_json"]))
            del detail["args_json"]
    if isinstance(detail, dict) and waiting.approvals:
        detail["approvals"] = list(waiting.approvals)  # towards the gate's quorum
    return detail if isinstance(detail, dict) and detail else None


@cli.command()
@click.argument("run_id", shell_complete=complete_run_id)
@output_option
def status(run_id: str) -> None:
    """A run's status, step, what it waits for (at a gate: the pending call's tool
    and arguments), its versions, and the commands refused for it. A run whose
    start waits for a worker is ``pending``. Exit 3 when there is no such run.

    Read like a worker resumes it: the latest snapshot in Postgres, the projected
    events after it, and the log beyond the projector's offset.
    """
    with client() as c:
        view = c.status(run_id)
    _print_view(run_id, view)


STATUSES = ("running", "paused", "blocked", "completed", "failed", "cancelled")


@cli.command("wait")
@click.argument("run_id", shell_complete=complete_run_id)
@click.option(
    "--for",
    "wanted",
    default="paused,completed,failed,cancelled",
    show_default=True,
    help="Statuses to wait for, comma-separated (of " + ", ".join(STATUSES) + ").",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    help="Seconds to wait; exit 4 when the run is not there by then.",
)
@output_option
def wait_for(run_id: str, wanted: str, timeout: float) -> None:
    """Wait until RUN's status is one of --for, then print it as ``status`` does.
    For scripts: ``es-agents wait $RUN --for paused`` before an approval."""
    statuses = tuple(s.strip() for s in wanted.split(",") if s.strip())
    unknown = [s for s in statuses if s not in STATUSES]
    if unknown or not statuses:
        raise click.BadParameter(
            f"{', '.join(unknown) or 'nothing'}: not a status (one of "
            f"{', '.join(STATUSES)})",
            param_hint="--for",
        )
    with client() as c:
        try:
            view = c.wait(run_id, until=statuses, timeout=timeout)
        except TimeoutError:
            c.status(run_id)  # no such run: exit 3 rather than 4
            raise
    _print_view(run_id, view)


def _print_view(run_id: str, view: RunView) -> None:
    summary: dict[str, object] = (
        _summary(view.state)
        if view.state is not None
        else {"run_id": run_id, "agent": view.agent, "status": view.status}
    )
    if view.state is not None:
        summary["awaiting"] = _awaiting(view.state)
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
    if view.archived:
        summary["archived"] = view.archived  # its rows purged: restore to read
    if machine():
        emit(summary)
        return
    for key, value in summary.items():
        if value not in (None, "", {}, []):
            click.echo(f"{key:>16}: {text(value)}")


@cli.command()
@click.option(
    "--status",
    "status_filter",
    type=click.Choice(
        ["running", "paused", "blocked", "completed", "failed", "cancelled"]
    ),
)
@click.option("--agent", default=None, help="Only runs of this agent.")
@click.option(
    "--since",
    type=ISO_TIME,
    default=None,
    help="Only runs updated at or after this UTC time.",
)
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True)
@output_option
def runs(
    status_filter: str | None, agent: str | None, since: datetime | None, limit: int
) -> None:
    """Runs from the `runs` table (as of the projector), latest first."""

    with client() as c:
        found = c.runs(
            status_filter,
            limit,
            agent=agent,
            since=since,
        )
    rows: list[dict[str, Any]] = [dataclasses.asdict(r) for r in found]
    if machine():
        emit_many(rows)
        return
    names = list(rows[0]) if rows else ["run_id", "agent", "status"]
    if any(r.get("last_message") for r in rows):  # threads: their last message
        rows = [{**r, "last_message": _short(r.get("last_message"))} for r in rows]
    else:
        names = [n for n in names if n != "last_message"]
    table(rows, names)


def _short(text: object, width: int = 48) -> str:
    line = " ".join(str(text or "").split())
    return line if len(line) <= width else line[: width - 1] + "…"


@cli.command()
@output_option
def agents() -> None:
    """The agents served on this prefix: version, live workers, the last heartbeat,
    tools and gates (-o json: each worker too)."""
    with client() as c:
        rows = c.agents()
    if machine():
        emit_many(rows)
        return
    if not rows:
        click.echo("no agent is served on this prefix (start one: es-agents worker)")
        return
    shown = [
        {
            **row,
            "live_workers": f"{row['live_workers']}/{len(row['workers'])}",  # type: ignore[arg-type]
            "seconds_since": f"{row['seconds_since']} s ago",
            "tools": ",".join(row["tools"]),  # type: ignore[arg-type]
            "gates": "-" if row["gates"] is None else ",".join(row["gates"]),  # type: ignore[arg-type]
        }
        for row in rows
    ]
    table(
        shown,
        ["agent", "agent_version", "live_workers", "seconds_since", "tools", "gates"],
    )


@cli.group()
def dlq() -> None:
    """The dead-letter topic: records that could not be decoded or applied."""


@dlq.command("list")
@click.option("--run", "run_id", default=None, help="Only this run's records.")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True)
@output_option
def dlq_list(run_id: str | None, limit: int) -> None:
    """The DLQ's records with their reasons and where each was read, oldest
    first (the latest --limit)."""
    from dataclasses import asdict  # noqa: PLC0415

    with client() as c:
        letters = c.dead_letters(run_id, limit)
    rows = [asdict(letter) for letter in letters]
    if machine():
        emit_many(rows)
        return
    table(rows, ["at", "run_id", "origin", "reason"])


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
@output_option
def schemas_check(directory: str | None) -> None:
    """Fail when a schema cannot read what an earlier version of it wrote."""
    from pathlib import Path  # noqa: PLC0415

    from es_agents.codec import SCHEMAS_DIR  # noqa: PLC0415
    from es_agents.schema_check import check  # noqa: PLC0415

    problems = check(Path(directory) if directory else SCHEMAS_DIR)
    if machine():
        emit({"compatible": not problems, "problems": problems})
        if problems:
            sys.exit(EXIT_REFUSED)
        return
    for problem in problems:
        click.echo(f"incompatible: {problem}", err=True)
    if problems:
        sys.exit(EXIT_REFUSED)
    click.echo("schemas: every version reads its earlier versions")
