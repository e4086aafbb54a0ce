"""Flow control at work (``core.flow``): a run takes a place before its steps,
or waits in the queue; every worker of the agent gives free places to queued runs.

A run's loop asks for a place once per activation, before its first step
(``hold_place``). Without one the run pauses with the reason ``queued``; its queue
row is written before the pause is durable, so a crash in between leaves a row
whose wake-up finds nothing to wake, never a queued run without a row. When an
activation ends with the run waiting for something else, or ended, its place is
released (``Worker``). ``admit_queued`` gives free places in priority, then arrival
order, and wakes those runs with a ``fire_timer`` command each, sent and
acknowledged in the transaction that gives the places.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from es_agents.core.commands import FireTimer
from es_agents.core.events import Interrupted
from es_agents.core.flow import QUEUED, Limits, Queued, flow_of
from es_agents.core.state import RunState
from es_agents.core.step import canonical_json, timer_id
from es_agents.ports import EventLog, Flow
from es_agents.runtime.context import Stepping


async def hold_place(loop: Stepping, state: RunState) -> bool:
    """True: the run may take steps (it holds a place, or its agent has no
    limits); False: it waits in the queue now (its pause is durable)."""
    ctx = loop.ctx
    flow = ctx.flow
    if flow is None:
        return True
    agent = ctx.agent.name
    tenant, priority = flow_of(state.vars)
    if await ctx.io(flow.take, agent, state.run_id, tenant, priority, ctx.limits):
        return True
    detail = canonical_json({"tenant": tenant, "priority": priority})
    paused = loop.add(Interrupted, reason=QUEUED, detail_json=detail)
    await ctx.io(flow.enqueue, agent, state.run_id, tenant, priority, paused.seq)
    await loop.flush()
    return False


def releases(state: RunState | None) -> bool:
    """Whether a run whose activation ended so gives its place back: it waits for
    something other than a place, or it ended."""
    if state is None or state.status == "running":
        return False
    return state.waiting is None or state.waiting.reason != QUEUED


def admit_queued(flow: Flow, log: EventLog, agent: str, limits: Limits) -> int:
    """Give the free places of ``agent`` to queued runs; the number woken. Raises
    what the log raises when the wake-ups are not acknowledged (nothing given)."""

    def wake(runs: Sequence[Queued]) -> None:
        now = datetime.now(UTC)
        log.send_all(
            [
                FireTimer(
                    run_id=q.run_id,
                    timer_id=timer_id(q.run_id, q.since_seq),
                    due_at=now,
                )
                for q in runs
            ]
        )

    return len(flow.admit(agent, limits, wake))
