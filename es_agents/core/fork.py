"""Forks: a new run whose log begins with another run's prefix.

``fork_events`` copies the origin's events ``0..at_seq`` under the new run's id and
appends ``forked``. Each copy keeps what it recorded -- model completions, tool
results, decisions -- so nothing of the prefix is asked or done again; each gets a new
event id, and each tool call the idempotency key the new run would have given it, so
no effect of the origin is reused or repeated by the fork. A tool call requested at
``at_seq`` and not returned is the fork's own to make (under its own key). The origin
is only read.
"""

from __future__ import annotations

from collections.abc import Sequence

from es_agents.core.commands import ForkRun
from es_agents.core.events import Event, Forked, ToolCallRequested, new_id
from es_agents.core.fold import fold
from es_agents.core.state import RunState
from es_agents.core.step import Refused
from es_agents.errors import FoldError


def fork_events(
    origin: Sequence[Event], command: ForkRun, origin_head: bytes
) -> tuple[list[Event], RunState]:
    """The fork's first events and its state after them; ``Refused`` when the
    origin cannot be forked at ``command.at_seq``."""
    at = command.at_seq
    prefix = [e for e in origin if e.seq <= at]
    if not origin:
        raise Refused(f"unknown run {command.origin_run}: no events to fork")
    if [e.seq for e in prefix] != list(range(at + 1)):
        last = origin[-1].seq
        raise Refused(
            f"run {command.origin_run} has no seq {at} to fork at (seqs 0..{last})"
        )
    new = command.run_id
    copies = [_copy(e, command.origin_run, new) for e in prefix]
    state = RunState(run_id=new)
    try:
        for event in copies:
            fold(state, event)
    except FoldError as e:
        raise Refused(f"run {command.origin_run} does not fold to seq {at}: {e}") from e
    if state.terminal:
        raise Refused(
            f"run {command.origin_run} is {state.status} at seq {at}: fork at an "
            "earlier seq"
        )
    forked = Forked(
        run_id=new,
        seq=at + 1,
        step=state.step,
        origin_run=command.origin_run,
        origin_seq=at,
        origin_head=origin_head,
        command_id=command.command_id,
        by=command.by,
    )
    fold(state, forked)
    return [*copies, forked], state


def _copy(event: Event, origin: str, new: str) -> Event:
    changes: dict[str, object] = {"run_id": new, "event_id": new_id(), "prev": b""}
    if isinstance(event, ToolCallRequested):
        key = event.idempotency_key
        own = f"{origin}:"
        changes["idempotency_key"] = (
            new + ":" + key[len(own) :] if key.startswith(own) else f"{new}:{key}"
        )
    return event.model_copy(update=changes)
