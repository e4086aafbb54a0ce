"""Commands to runs: ``start``, ``approve``, ``reject``, ``provide-input``,
``cancel``; each prints what became of it (applied, refused, queued)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from es_agents.cli.base import (
    EXIT_REFUSED,
    EXIT_UNAVAILABLE,
    F,
    cli,
    complete_run_id,
    emit,
    machine,
    output_option,
)

if TYPE_CHECKING:
    from es_agents.client import Client, CommandResult
    from es_agents.core import Command


def client() -> Client:
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


def _report(result: CommandResult, quiet_applied: bool = False) -> None:
    """Print a command's fate; exit 1 when it was refused."""
    if machine():
        emit(
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
        sys.exit(EXIT_REFUSED)


@cli.command("start")
@click.argument("agent")
@click.option(
    "--input",
    "input_json",
    default="{}",
    show_default=True,
    help="The run's input as JSON; @FILE reads it from a file, - from stdin.",
)
@click.option("--run-id", default=None, help="Default: a new UUID.")
@click.option(
    "--queue",
    is_flag=True,
    help="Send the start even if no worker has served AGENT yet (it waits for "
    "one); without it such a start is refused, naming the served agents.",
)
@click.option(
    "--budget",
    "budget_json",
    default=None,
    help="The run's own limits instead of its agent's, as JSON: {\"max_steps\": 20, "
    '"max_cost": 0.5, "on_exceeded": "pause"} (max_steps, max_model_calls, '
    "max_tokens, max_cost in USD, max_seconds, max_turns; on_exceeded fail|pause).",
)
@click.option(
    "--tenant",
    default=None,
    help="Whose run it is, for an agent with a limit of active runs per tenant.",
)
@click.option(
    "--priority",
    type=click.IntRange(-1_000_000, 1_000_000),
    default=0,
    show_default=True,
    help="Its place when it waits for a place among the agent's active runs: "
    "higher first, then in arrival order.",
)
@wait_options
@output_option
def start_run(  # noqa: PLR0917 - click passes options positionally
    agent: str,
    input_json: str,
    run_id: str | None,
    queue: bool,
    budget_json: str | None,
    tenant: str | None,
    priority: int,
    wait_seconds: float,
    no_wait: bool,
) -> None:
    """Start a run of AGENT; prints the run id, then what became of the start."""
    input_json = _require_json(input_json, "--input")
    budget = None if budget_json is None else _require_object(budget_json, "--budget")
    with client() as c:
        result = c.start(
            agent,
            input_json,
            run_id,
            wait=0 if no_wait else wait_seconds,
            unserved="queue" if queue else "refuse",
            budget=budget,
            tenant=tenant,
            priority=priority,
        )
    if not machine() and result.status != "refused":
        click.echo(result.run_id)
    _report(result, quiet_applied=True)


@cli.command()
@click.argument("run_id", shell_complete=complete_run_id)
@click.option(
    "--at",
    "at_seq",
    type=click.IntRange(min=0),
    required=True,
    help="The origin's last event to copy (its seq).",
)
@click.option("--run-id", "new_run_id", default=None, help="Default: a new UUID.")
@click.option("--by", default=None, help="Who forks (recorded in the fork).")
@wait_options
@output_option
def fork(  # noqa: PLR0917 - click passes options positionally
    run_id: str,
    at_seq: int,
    new_run_id: str | None,
    by: str | None,
    wait_seconds: float,
    no_wait: bool,
) -> None:
    """A new run whose log begins with RUN's events up to --at: recorded
    completions kept (no model call re-issued), its own idempotency keys (no effect
    of RUN reused or repeated). RUN is untouched. Prints the new run id."""
    with client() as c:
        result = c.fork(
            run_id, at_seq, new_run_id, by, wait=0 if no_wait else wait_seconds
        )
    if not machine() and result.status != "refused":
        click.echo(result.run_id)
    _report(result, quiet_applied=True)


def _require_json(text: str, option: str) -> str:
    """The JSON given, read from a file for ``@FILE`` and from stdin for ``-``
    (an input larger than a command line)."""
    if text == "-":
        text = sys.stdin.read()
    elif text.startswith("@"):
        try:
            text = Path(text[1:]).read_text(encoding="utf-8")
        except OSError as e:
            raise click.BadParameter(
                f"cannot read {text[1:]}: {e}", param_hint=option
            ) from e
    try:
        json.loads(text)
    except ValueError as e:
        raise click.BadParameter(f"not JSON: {e}", param_hint=option) from e
    return text


def _require_object(text: str, option: str) -> dict[str, object]:
    value = json.loads(_require_json(text, option))
    if not isinstance(value, dict):
        raise click.BadParameter("a JSON object", param_hint=option)
    return value


def _decide(command: Command, wait_seconds: float, no_wait: bool) -> None:
    with client() as c:
        result = c.send(command, wait=0 if no_wait else wait_seconds)
    _report(result)


def signing_options(fn: F) -> F:
    """--key / --valid-for: sign the decision with an approver's private key."""
    fn = click.option(
        "--valid-for",
        "valid_minutes",
        type=click.FloatRange(min=0, min_open=True),
        default=15.0,
        show_default=True,
        help="Minutes the signed decision stays valid.",
    )(fn)
    return click.option(
        "--key",
        "key_file",
        type=click.Path(exists=True, dir_okay=False),
        default=None,
        help="Sign with this Ed25519 private key (es-agents keys new).",
    )(fn)


def _signed_decision(  # noqa: PLR0917 - a decision's parts
    approve: bool,
    run_id: str,
    by: str,
    gate: str | None,
    note: str | None,
    key_file: str | None,
    valid_minutes: float,
    wait_seconds: float,
    no_wait: bool,
    args_json: str | None = None,
) -> None:
    from datetime import timedelta  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    from es_agents.approvals import SigningKey  # noqa: PLC0415

    key = SigningKey.from_file(Path(key_file)) if key_file else None
    wait = 0 if no_wait else wait_seconds
    valid = timedelta(minutes=valid_minutes)
    with client() as c:
        if approve:
            result = c.approve(
                run_id, by, gate, note, wait, key=key, valid_for=valid, args=args_json
            )
        else:
            result = c.reject(run_id, by, gate, note, wait, key=key, valid_for=valid)
    _report(result)


@cli.command()
@click.argument("run_id", shell_complete=complete_run_id)
@click.option("--by", required=True, help="Who approves.")
@click.option("--gate", default=None, help="Approve a named gate ahead of time.")
@click.option("--comment", default=None)
@click.option(
    "--args",
    "args_json",
    default=None,
    help="Edited arguments (a JSON object; @FILE, - for stdin) for the call the "
    "gate asks about: the call runs with them.",
)
@signing_options
@wait_options
@output_option
def approve(  # noqa: PLR0917 - click passes options positionally
    run_id: str,
    by: str,
    gate: str | None,
    comment: str | None,
    args_json: str | None,
    key_file: str | None,
    valid_minutes: float,
    wait_seconds: float,
    no_wait: bool,
) -> None:
    """Approve the gate RUN waits at (or --gate, ahead of time); --key signs it;
    --args runs the call with edited arguments."""
    edited = None if args_json is None else _require_json(args_json, "--args")
    _signed_decision(
        True,
        run_id,
        by,
        gate,
        comment,
        key_file,
        valid_minutes,
        wait_seconds,
        no_wait,
        edited,
    )


@cli.command()
@click.argument("run_id", shell_complete=complete_run_id)
@click.option("--by", required=True, help="Who rejects.")
@click.option("--gate", default=None, help="Reject a named gate ahead of time.")
@click.option("--reason", default=None)
@signing_options
@wait_options
@output_option
def reject(  # noqa: PLR0917 - click passes options positionally
    run_id: str,
    by: str,
    gate: str | None,
    reason: str | None,
    key_file: str | None,
    valid_minutes: float,
    wait_seconds: float,
    no_wait: bool,
) -> None:
    """Reject the gate RUN waits at (or --gate, ahead of time); --key signs it."""
    _signed_decision(
        False, run_id, by, gate, reason, key_file, valid_minutes, wait_seconds, no_wait
    )


@cli.command("provide-input")
@click.argument("run_id", shell_complete=complete_run_id)
@click.option("--by", required=True)
@click.option(
    "--input",
    "input_json",
    required=True,
    help="JSON; @FILE reads it from a file, - from stdin.",
)
@wait_options
@output_option
def provide_input(
    run_id: str,
    by: str,
    input_json: str,
    wait_seconds: float,
    no_wait: bool,
) -> None:
    """Give RUN the input it waits for (or settle an uncertain effect's result)."""
    input_json = _require_json(input_json, "--input")
    with client() as c:  # encrypted under the run's key when a master key is set
        result = c.provide_input(
            run_id, by, input_json, wait=0 if no_wait else wait_seconds
        )
    _report(result)


@cli.command()
@click.argument("run_id", shell_complete=complete_run_id)
@click.argument("text", required=False)
@click.option("--by", default=None, help="Who sends it.  [default: $USER]")
@click.option("--end", is_flag=True, help="End the thread with its last reply.")
@click.option(
    "--timeout",
    type=float,
    default=120.0,
    show_default=True,
    help="Seconds to wait for the answer.",
)
@click.option("--no-wait", is_flag=True, help="Send the message; do not wait.")
@output_option
def say(  # noqa: PLR0917 - click passes options positionally
    run_id: str,
    text: str | None,
    by: str | None,
    end: bool,
    timeout: float,
    no_wait: bool,
) -> None:
    """Send the thread RUN its next message (TEXT; - reads stdin) and print the
    answer; --end ends the thread. Exit 1 when refused (e.g. RUN does not wait
    for a message), 4 when no answer came within --timeout."""
    import getpass  # noqa: PLC0415

    who = by or getpass.getuser()
    if text == "-":
        text = sys.stdin.read()
    if end == (text is not None):
        raise click.UsageError("give the message TEXT, or --end (not both)")
    with client() as c:
        if end or no_wait:
            _report(
                c.send_message(
                    run_id, text or "", who, wait=0 if no_wait else 10, end=end
                )
            )
            return
        try:
            reply = c.say(run_id, text or "", who, timeout=timeout)
        except TimeoutError as e:
            click.echo(
                f"{e}; the message was sent, the answer may still come", err=True
            )
            sys.exit(EXIT_UNAVAILABLE)
    if machine():
        emit(
            {
                "run_id": reply.run_id,
                "turn": reply.turn,
                "reply": reply.text,
                "status": reply.status,
                "waiting": reply.waiting,
            }
        )
        return
    if reply.text is not None:  # None: the answer is a tool call (see below)
        click.echo(
            reply.text if isinstance(reply.text, str) else json.dumps(reply.text)
        )
    if reply.waiting != "awaiting_message":
        click.echo(
            f"(run {run_id} is {reply.status}"
            + (f": {reply.waiting})" if reply.waiting else ")"),
            err=True,
        )


@cli.command()
@click.argument("run_id", shell_complete=complete_run_id)
@click.option("--by", required=True)
@click.option("--reason", default=None)
@wait_options
@output_option
def cancel(
    run_id: str,
    by: str,
    reason: str | None,
    wait_seconds: float,
    no_wait: bool,
) -> None:
    """Stop RUN for good (status cancelled)."""
    from es_agents.core.commands import Cancel  # noqa: PLC0415

    command = Cancel(run_id=run_id, by=by, reason=reason)
    _decide(command, wait_seconds, no_wait)


@cli.command()
@click.argument("run_id", shell_complete=complete_run_id)
@output_option
def forget(run_id: str) -> None:
    """Destroy a finished run's data key (its agent encrypts its payloads): its
    completions, tool arguments and results, input and output become unreadable
    everywhere -- log, object store, projections, snapshots -- while its events'
    structure, hashes and status stay. Exit 1 for a run that is still going (cancel
    it first) or has no key."""
    from es_agents.core.step import Refused  # noqa: PLC0415

    with client() as c:
        try:
            forgotten = c.forget(run_id)
        except Refused as e:
            _forget_refused(run_id, str(e))
            return
    if not forgotten:
        _forget_refused(
            run_id,
            "it has no data key (its agent does not encrypt, or it was "
            "forgotten before)",
        )
        return
    if machine():
        emit({"run_id": run_id, "forgotten": True})
    else:
        click.echo(f"{run_id}: forgotten", err=True)


def _forget_refused(run_id: str, reason: str) -> None:
    if machine():
        emit({"run_id": run_id, "forgotten": False, "reason": reason})
    else:
        click.echo(f"forget {run_id}: refused ({reason})", err=True)
    sys.exit(EXIT_REFUSED)
