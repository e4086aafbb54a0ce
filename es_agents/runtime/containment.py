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
from typing import Protocol

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


class Keeper(Protocol):
    """What containment needs of the worker: its context, and to let a run go."""

    ctx: RunContext

    def forget(self, actor: RunActor) -> None:
        """Stop driving the run here (another worker owns it now)."""
        ...

    def quarantine(self, actor: RunActor, reason: str) -> None:
        """Refuse the run's commands, with ``reason``, until a restart."""
        ...

    def skip(self, partition: int, offset: int) -> None:
        """A command handled without events: its offset may be committed."""
        ...


async def contain_payload(
    w: Keeper, actor: RunActor, failed: RunLoop | None, error: PayloadUnavailable
) -> None:
    """A claim-checked payload the run needs cannot be read: pause the run with
    reason ``payload_unavailable`` (its position is known without payloads)."""
    log.warning("run %s: %s", actor.run_id, error)
    loop = await RunLoop.open(w.ctx, actor, restore=False)
    if failed is not None:
        loop.applied = failed.applied
    await w.ctx.io(loop.apply_commands)  # deciding needs no payload; stepping does
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
    w: Keeper, actor: RunActor, loop: RunLoop | None, kind: str, reason: str
) -> bool:
    """End the run with its failure; False when this worker must let it go."""
    try:
        await end_run(w, actor, loop, kind, reason)
    except FencedError as e:
        log.warning("run %s: %s", actor.run_id, e)
        w.forget(actor)
        return False
    except (Unavailable, AppendError):
        raise
    except Exception as e:
        if infrastructure(e):
            raise Unavailable(f"run {actor.run_id}: {e!r}") from e
        log.exception("run %s: cannot record its failure", actor.run_id)
        w.quarantine(actor, f"run {actor.run_id} cannot be failed: {e}")
        if loop is not None:
            for offset in loop.applied:
                w.skip(actor.partition, offset)
    return True


async def end_run(  # noqa: PLR0912 - one branch per way a failure is kept
    w: Keeper, actor: RunActor, failed: RunLoop | None, kind: str, reason: str
) -> None:
    """Record ``run_failed`` (kind, reason) for a run that cannot go on.

    The run is loaded afresh from the log (the failed loop's state may be half
    folded); what the failed loop had buffered and folded without error -- the
    commands it applied, the completion it received -- is kept when it still
    follows the log, so a billed model call is not lost.
    """
    log.warning("run %s failed (%s): %s", actor.run_id, kind, reason)
    try:
        loop = await RunLoop.open(w.ctx, actor)
    except (FencedError, Unavailable, AppendError):
        raise
    except Exception as e:
        if infrastructure(e):
            raise Unavailable(f"run {actor.run_id}: {e!r}") from e
        w.quarantine(actor, f"run {actor.run_id} cannot be loaded: {e}")
        if failed is not None:
            await refuse_applied(w.ctx, failed, f"run failed ({kind}): {reason}")
            for offset in failed.applied:
                w.skip(actor.partition, offset)
        return
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
            await refuse_applied(w.ctx, failed, f"run failed ({kind}): {reason}")
            failed.verdicts = []
    if base.seq < 0 or base.terminal:
        loop.state = None
        await loop.flush()  # nothing to record; the commands' offsets are done
        return
    loop.state, loop.buffer = base, kept
    loop.add(RunFailed, error=f"{kind}: {reason}"[:4000], kind=kind)
    await loop.flush()


async def refuse_applied(ctx: RunContext, failed: RunLoop, reason: str) -> None:
    """Commands whose events were never made durable: refused, with the reason."""
    refused = [Decided(v.command, "refused", reason) for v in failed.verdicts]
    if refused:
        await ctx.io(ctx.book.decided, refused)
