"""Child runs: a tool call that hands a task to another agent.

The call's intention is written ahead like any call's; its effect is the start of
a run of the other agent, whose id comes from the call's idempotency key
(``run:5`` -> ``run.5``) and whose start command's id from that, so a start sent
again (a retry, a crash before it was recorded) starts nothing more. Once sent,
``state_patched child:<call id>`` records it; the call stays open until the child
ends. The child's worker tells the parent (``child_ended``) once the end is
durable; the parent appends ``child_returned``: the child's output is the call's
result and its usage counts in the parent's. A parent that waits only for
children pauses as a row (``awaiting_children``) with a timer: if the child's
worker died between its end and telling, the timer looks the child up in the log.
Cancelling a parent cancels its open children.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from es_agents.core.commands import Cancel, ChildEnded, Command, StartRun
from es_agents.core.events import StatePatched
from es_agents.core.fold import replay
from es_agents.core.state import CHILD_PREFIX, RunState
from es_agents.core.step import CallTool, canonical_json, child_ended
from es_agents.runtime.context import RunContext, Stepping

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Started:
    """A call's child run was started (its outcome comes when the child ends)."""

    run_id: str


def child_run_id(key: str) -> str:
    """The child run a call starts: its idempotency key ``run:step`` -> ``run.step``."""
    run, _, step = key.rpartition(":")
    return f"{run}.{step}"


def start_command(run_id: str, call: CallTool, key: str, agent: str) -> StartRun:
    child = child_run_id(key)
    return StartRun(
        command_id=f"start:{child}",
        run_id=child,
        agent=agent,
        input_json=canonical_json(call.args),
        parent_run_id=run_id,
        parent_call_id=call.call_id,
    )


async def start(
    loop: Stepping, run_id: str, call: CallTool, key: str, agent: str
) -> Started:
    """Send the child's start (the call's intention is durable); its input sealed
    under the child's data key when this run or the child's agent encrypts and this
    worker holds the master key (the commands topic never expires)."""
    command = start_command(run_id, call, key, agent)
    ctx = loop.ctx
    cipher = ctx.cipher
    if cipher is not None and (ctx.encrypt or await ctx.io(_encrypts, ctx, agent)):
        sealed = await ctx.io(cipher.encrypt_text, command.run_id, command.input_json)
        command = command.model_copy(update={"input_json": sealed})
    await ctx.io(ctx.log.send, command)
    return Started(command.run_id)


def sealed_ends(ctx: RunContext, commands: list[Command]) -> list[Command]:
    """What an encrypting run tells its parent at its end (its output or error),
    sealed under the parent's data key: the parent's worker opens it; the commands
    topic never holds it in plain text."""
    cipher = ctx.cipher
    if cipher is None or not ctx.encrypt:
        return commands
    out: list[Command] = []
    for command in commands:
        if not isinstance(command, ChildEnded):
            out.append(command)
            continue
        update = {
            name: cipher.encrypt_text(command.run_id, value)
            for name in ("output_json", "error")
            if (value := getattr(command, name))
        }
        out.append(command.model_copy(update=update))
    return out


def _encrypts(ctx: RunContext, agent: str) -> bool:
    served = ctx.book.agent(agent)
    return served is not None and served.encrypted


def record(loop: Stepping, call_id: str, started: Started) -> None:
    """The child's start, recorded: the call is no longer in flight."""
    loop.add(
        StatePatched,
        key=CHILD_PREFIX + call_id,
        value_json=canonical_json(started.run_id),
    )


def on_end(state: RunState) -> list[Command]:
    """What a run that just ended sends: its parent's ``child_ended``, and a
    cancel to each child it still waits for."""
    out: list[Command] = []
    told = child_ended(state)
    if told is not None:
        out.append(told)
    for child in state.children.values():
        out.append(
            Cancel(
                command_id=f"cancel:{child}",
                run_id=child,
                by=f"run {state.run_id}",
                reason=f"its parent run ended ({state.status})",
            )
        )
    return out


def ended_children(ctx: RunContext, state: RunState) -> list[ChildEnded]:
    """The open children whose end is in the log (read there, not in the read
    side): what the parent was not told because a worker died in between."""
    found: list[ChildEnded] = []
    for child in state.children.values():
        try:
            events = ctx.log.read_run(child)
        except Exception as e:  # looked up again at the next timer
            log.warning("run %s: child %s not read: %s", state.run_id, child, e)
            continue
        if not events:
            continue
        ended = replay(events)
        if ctx.cipher is not None:  # an encrypting child's output, opened
            ended = ctx.cipher.reveal(child, ended)
        told = child_ended(ended)
        if told is not None:
            found.append(told)
    return found
