"""An approval at a signed gate proves itself before its call runs.

The worker that judged a signed decision checked its signature then; the run's log
keeps the signature with the decision (``resumed`` and ``approval_recorded``), and
here it is verified again, from the folded state alone, whenever a call of that
gate is about to run or to be reconciled -- on any worker, after any restart. So a
``resumed`` appended by whoever holds the writer key (or replayed from another
pause, or altered on its way) starts nothing: the run waits at the gate again (or,
with the call's intention already in the log, for a person), and the reason is
logged.
"""

from __future__ import annotations

import logging

from es_agents.core.events import Interrupted
from es_agents.core.state import PendingToolCall, RunState
from es_agents.core.step import CallTool, CallTools, canonical_json
from es_agents.runtime.context import Stepping
from es_agents.runtime.effects import uncertain

log = logging.getLogger(__name__)


def _why(loop: Stepping, state: RunState, gate: str) -> str | None:
    approvals = loop.ctx.approvals
    return approvals.unproven(state, gate) if approvals is not None else None


async def held_back(
    loop: Stepping, state: RunState, step: CallTool | CallTools
) -> bool:
    """True when a call of ``step`` is approved by a decision that does not prove
    itself: the run pauses at its gate again, asking anew, and nothing runs."""
    calls = step.calls if isinstance(step, CallTools) else (step,)
    for call in calls:
        why = _why(loop, state, call.tool)
        if why is None:
            continue
        log.warning(
            "run %s: the approval of %s (call %s) does not verify: %s; it waits "
            "at the gate again",
            state.run_id,
            call.tool,
            call.call_id,
            why,
        )
        asked = next(
            (c.args_json for c in state.open_tool_calls if c.call_id == call.call_id),
            canonical_json(call.args),
        )
        detail = {
            "call_id": call.call_id,
            "tool": call.tool,
            "args_json": asked,
            "gate": call.tool,
            "void": f"the approval does not verify: {why}",
        }
        loop.add(
            Interrupted, reason="awaiting_approval", detail_json=canonical_json(detail)
        )
        await loop.flush()
        return True
    return False


async def unproven_intention(
    loop: Stepping, state: RunState, pending: PendingToolCall
) -> bool:
    """True when a dangling call's approval does not prove itself: it is not
    reconciled (which may call the tool); the run waits for a person."""
    why = _why(loop, state, pending.tool)
    if why is None:
        return False
    log.warning(
        "run %s: the approval of the dangling call %s does not verify: %s",
        state.run_id,
        pending.call_id,
        why,
    )
    await uncertain(
        loop,
        state,
        pending.idempotency_key,
        pending.tool,
        pending.call_id,
        why=f"the approval does not verify: {why}",
    )
    return True
