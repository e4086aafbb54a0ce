"""One run's failure is that run's alone.

Whatever a run's planner, model, tools or fold do wrong ends it as ``run_failed``
with the kind; a claim-checked payload it needs but cannot read pauses it
(``payload_unavailable``); a run that cannot even be loaded is quarantined in this
process (its commands refused with the reason). Only the log or the database being
unreachable stops the worker (crash-only).
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field

from es_agents.core.events import Event, Interrupted, RunFailed
from es_agents.core.fold import fold
from es_agents.core.state import RunState
from es_agents.core.step import canonical_json
from es_agents.errors import (
    AppendError,
    EsAgentsError,
    FencedError,
    PayloadUnavailable,
    Unavailable,
)
from es_agents.ports import Decided
from es_agents.runtime.context import RunActor, RunContext
from es_agents.runtime.run_loop import RunLoop

log = logging.getLogger(__name__)

# Errors of these libraries mean the log, the database or the object store is out of
# reach (an adapter should have said Unavailable): crash-only, never a run's failure.
_DRIVERS = frozenset(
    {"confluent_kafka", "cimpl", "psycopg", "psycopg_pool", "botocore"}
)


def infrastructure(error: BaseException) -> bool:
    module = type(error).__module__.split(".")[0]
    return module in _DRIVERS or isinstance(error, OSError)


@dataclass
class Aftermath:
    """What the worker does once a failure is contained: values, not calls back."""

    let_go: bool = False  # another worker owns the run now: stop driving it here
    quarantine: str | None = None  # refuse the run's commands, with this reason
    skip: list[int] = field(default_factory=list)  # offsets handled without events


async def contain_payload(
    ctx: RunContext, actor: RunActor, failed: RunLoop | None, error: PayloadUnavailable
) -> None:
    """A claim-checked payload the run needs cannot be read: pause the run with
    reason ``payload_unavailable`` (its position is known without payloads)."""
    log.warning("run %s: %s", actor.run_id, error)
    loop = await RunLoop.open(ctx, actor, restore=False)
    if failed is not None:
        loop.applied = failed.applied
    await ctx.io(loop.apply_commands)  # deciding needs no payload; stepping does
    state = loop.state
    if state is None or state.status != "running":
        await loop.flush()
        return
    loop.add(
        Interrupted,
        reason="payload_unavailable",
        detail_json=canonical_json(
            {
                "run_id": error.run_id or actor.run_id,
                "step": error.step,
                "key": error.key,
                "error": str(error),
                "resolve": "restore the object, then "
                "es-agents provide-input RUN --by NAME --input '{}'",
            }
        ),
    )
    await loop.flush()


async def contain(
    ctx: RunContext, actor: RunActor, loop: RunLoop | None, kind: str, reason: str
) -> Aftermath:
    """End the run with its failure; what the worker does then."""
    try:
        return await end_run(ctx, actor, loop, kind, reason)
    except FencedError as e:
        log.warning("run %s: %s", actor.run_id, e)
        return Aftermath(let_go=True)
    except (Unavailable, AppendError):
        raise
    except Exception as e:
        if infrastructure(e):
            raise Unavailable(f"run {actor.run_id}: {e!r}") from e
        log.exception("run %s: cannot record its failure", actor.run_id)
        return Aftermath(
            quarantine=f"run {actor.run_id} cannot be failed: {e}",
            skip=list(loop.applied) if loop is not None else [],
        )


async def end_run(
    ctx: RunContext, actor: RunActor, failed: RunLoop | None, kind: str, reason: str
) -> Aftermath:
    """Record ``run_failed`` (kind, reason) for a run that cannot go on.

    The run is loaded afresh from the log (the failed loop's state may be half
    folded); what the failed loop had buffered and folded without error -- the
    commands it applied, the completion it received -- is kept when it still
    follows the log, so a billed model call is not lost.
    """
    log.warning("run %s failed (%s): %s", actor.run_id, kind, reason)
    try:
        loop = await RunLoop.open(ctx, actor)
    except (FencedError, Unavailable, AppendError):
        raise
    except Exception as e:
        if infrastructure(e):
            raise Unavailable(f"run {actor.run_id}: {e!r}") from e
        if failed is not None:
            await refuse_applied(ctx, failed, f"run failed ({kind}): {reason}")
        return Aftermath(
            quarantine=f"run {actor.run_id} cannot be loaded: {e}",
            skip=list(failed.applied) if failed is not None else [],
        )
    kept: list[Event] = []
    base = loop.state if loop.state is not None else RunState(actor.run_id)
    if failed is not None and failed.buffer and failed.buffer[0].seq == base.seq + 1:
        candidate = copy.deepcopy(base)
        try:
            for event in failed.buffer:
                fold(candidate, event)
        except EsAgentsError:
            pass
        else:
            kept, base = list(failed.buffer), candidate
    if failed is not None:
        loop.applied = failed.applied
        if kept:
            loop.verdicts = failed.verdicts
        else:
            await refuse_applied(ctx, failed, f"run failed ({kind}): {reason}")
            failed.verdicts = []
    if base.seq < 0 or base.terminal:
        loop.state = None
        await loop.flush()  # nothing to record; the commands' offsets are done
        return Aftermath()
    loop.state, loop.buffer = base, kept
    loop.add(RunFailed, error=f"{kind}: {reason}"[:4000], kind=kind)
    await loop.flush()
    return Aftermath()


async def refuse_applied(ctx: RunContext, failed: RunLoop, reason: str) -> None:
    """Commands whose events were never made durable: refused, with the reason."""
    refused = [Decided(v.command, "refused", reason) for v in failed.verdicts]
    if refused:
        await ctx.io(ctx.book.decided, refused)
