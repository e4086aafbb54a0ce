"""Tool steps: the call with its idempotency key, the dedupe table for tools that
cannot honor keys, and reconciliation of a call whose outcome the log lacks.

Invariant 4: an effect happens at most once per key. A dangling
``tool_call_requested`` is settled by the downstream's lookup, a retry the downstream
dedupes, or the ledger; when none can tell, the run pauses (``uncertain_effect``)
for a person -- never a silent second call.
"""

from __future__ import annotations

import json
import logging
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any

from pydantic import JsonValue

from es_agents.core.events import Interrupted, ToolCallRequested, ToolReturned
from es_agents.core.state import PendingToolCall, RunState
from es_agents.core.step import CallTool, canonical_json
from es_agents.daemon_pool import DaemonPool
from es_agents.errors import FencedError, RetryableToolError, TerminalToolError
from es_agents.retry import retrying
from es_agents.tools import Lookup, Tool, ToolContext

if TYPE_CHECKING:
    from es_agents.run_loop import RunLoop

log = logging.getLogger(__name__)

TOOL_TRIES = 3


def call_tool(loop: RunLoop, state: RunState, step: CallTool) -> None:
    number = state.step + 1
    key = f"{state.run_id}:{number}"
    tool = loop.agent.tools.get(step.tool)
    loop.add(
        ToolCallRequested,
        step=number,
        call_id=step.call_id,
        tool=step.tool,
        args_json=canonical_json(step.args),
        idempotency_key=key,
        side_effect=tool.side_effect if tool is not None else False,
    )
    loop.flush()  # write-ahead: nothing happens downstream before this is durable
    result: Any
    error: str | None
    if tool is None:
        result, error = None, f"unknown tool {step.tool!r}"
    else:
        ctx = context(loop, state.run_id, number, key)
        with loop.ctx.tracer.tool_call(step.tool, step.call_id) as span:
            result, error = invoke(loop, tool, step.args, ctx)
            if error is not None:
                span.set("error.type", "tool_error")
    loop.ctx.probe.hit("after_action:tool")
    if result is _UNCERTAIN:
        uncertain(loop, state, key, step.tool, step.call_id, why=error)
        return
    loop.add(ToolReturned, call_id=step.call_id, result_json=result, error=error)


def context(
    loop: RunLoop, run_id: str, step: int, key: str, attempt: int = 1
) -> ToolContext:
    return ToolContext(
        run_id, step, key, attempt, partition=loop.actor.partition, epoch=loop.epoch
    )


def invoke(
    loop: RunLoop,
    tool: Tool[Any],
    args: dict[str, JsonValue],
    ctx: ToolContext,
) -> tuple[Any, str | None]:
    """Call the tool (through the dedupe table when it needs one)."""
    ledger = loop.ctx.ledger
    if tool.needs_dedupe_table:
        record = ledger.begin(ctx.idempotency_key, ctx.run_id, ctx.step, tool.name)
        if record.status == "done":
            return record.result_json, record.error
        if record.status == "started":
            return _UNCERTAIN, None
        loop.ctx.probe.hit("after_claim:tool")
    try:
        result, error = _call(loop, tool, args, ctx)
    except FencedError:
        if tool.needs_dedupe_table:  # refused downstream: the call did not happen
            ledger.release(ctx.idempotency_key)
        raise
    if tool.needs_dedupe_table and result is not _UNCERTAIN:
        ledger.finish(ctx.idempotency_key, result, error)
    return result, error


def _call(  # noqa: PLR0911 - one return per outcome of a call
    loop: RunLoop,
    tool: Tool[Any],
    args: dict[str, JsonValue],
    ctx: ToolContext,
) -> tuple[str | None, str | None]:
    redactor = loop.ctx.redactor
    try:
        if redactor is not None:  # the tool gets its secrets' real values
            args = redactor.open_args(ctx.run_id, args)
        for tried in retrying(TOOL_TRIES, on=(RetryableToolError,), maximum=2.0):
            with tried:
                value = _run_tool(tool, args, ctx)
                if redactor is not None:  # and what it returns as secret is sealed
                    value = redactor.seal_result(ctx.run_id, value)
                result = canonical_json(value)
    except _TimedOut:
        if tool.side_effect:  # it may still happen: a person decides
            return _UNCERTAIN, f"timed out after {tool.timeout} s"
        return None, f"timed out after {tool.timeout} s"
    except RetryableToolError as e:
        return None, f"retryable error, gave up after {TOOL_TRIES} tries: {e}"
    except TerminalToolError as e:
        return None, str(e)
    except FencedError:
        raise  # the downstream refused our fencing token: we lost the run
    except Exception as e:
        return None, f"{type(e).__name__}: {e}"
    limit = loop.ctx.max_event_bytes
    if loop.ctx.claims is None and len(result.encode()) > limit:
        # Larger than one log record may be: the run hears of it as an error
        # instead of the worker failing its append.
        return None, (
            f"result of {len(result.encode())} bytes exceeds the "
            f"{limit}-byte event limit and no object store is "
            "configured for payloads"
        )
    return result, None


def _run_tool(
    tool: Tool[Any], args: dict[str, JsonValue], ctx: ToolContext
) -> JsonValue:
    """Call the tool on a daemon thread, waiting at most its timeout.

    A call past its timeout keeps its thread (Python cannot stop one); daemon
    threads never keep the worker from exiting.
    """
    if tool.timeout is None:
        return tool(args, ctx)
    future = _TOOL_THREADS.submit(lambda: tool(args, ctx))
    try:
        result: JsonValue = future.result(tool.timeout)
    except FutureTimeout as e:
        log.warning(
            "run %s: tool %s timed out after %s s",
            ctx.run_id,
            tool.name,
            tool.timeout,
        )
        raise _TimedOut from e
    return result


def reconcile(loop: RunLoop, state: RunState, pending: PendingToolCall) -> None:
    """A ``tool_call_requested`` with no outcome: find out what happened by key,
    and record it as ``tool_returned`` marked reconciled (or pause, uncertain)."""
    outcome = _reconciled_outcome(loop, state, pending)
    if outcome is not None and outcome[0] is _UNCERTAIN:
        uncertain(
            loop,
            state,
            pending.idempotency_key,
            pending.tool,
            pending.call_id,
            why=outcome[1],
        )
    elif outcome is not None:
        result, error = outcome
        loop.add(
            ToolReturned,
            call_id=pending.call_id,
            result_json=result,
            error=error,
            reconciled=True,
        )
        loop.ctx.telemetry.reconciled(loop.agent.name)


def _reconciled_outcome(  # noqa: PLR0911 - one return per way of knowing
    loop: RunLoop, state: RunState, pending: PendingToolCall
) -> tuple[str | None, str | None] | None:
    key = pending.idempotency_key
    resume = state.last_resume
    if resume is not None and resume.seq > pending.seq and resume.reason == "input":
        return resume.input_json, None  # a person settled an uncertain effect
    tool = loop.agent.tools.get(pending.tool)
    if tool is None:
        return None, f"unknown tool {pending.tool!r}"
    ctx = context(loop, state.run_id, pending.step, key, attempt=2)
    args = _args(pending.args_json)
    if not tool.side_effect:
        return _call(loop, tool, args, ctx)
    if tool.lookup is not None:
        found = tool.lookup(key)
        if found.status == "done":
            return canonical_json(found.result), None
        if found.status == "absent" and tool.honors_idempotency_key:
            return _call(loop, tool, args, ctx)
        uncertain(loop, state, key, pending.tool, pending.call_id, found)
        return None
    if tool.honors_idempotency_key:
        # The downstream dedupes by key: calling again returns the first result.
        return _call(loop, tool, args, ctx)
    record = loop.ctx.ledger.get(key)
    if record is None:  # the call never started: the ledger row comes first
        result, error = invoke(loop, tool, args, ctx)
        if result is not _UNCERTAIN:
            return result, error
    elif record.status == "done":
        return record.result_json, record.error
    uncertain(loop, state, key, pending.tool, pending.call_id)
    return None


def uncertain(  # noqa: PLR0917 - what a person needs to settle it
    loop: RunLoop,
    state: RunState,
    key: str,
    tool: str,
    call_id: str,
    found: Lookup | None = None,
    why: str | None = None,
) -> None:
    """Neither the downstream nor the ledger can tell: a person decides."""
    loop.add(
        Interrupted,
        reason="uncertain_effect",
        detail_json=canonical_json(
            {
                "idempotency_key": key,
                "tool": tool,
                "call_id": call_id,
                "lookup": found.status if found is not None else None,
                "why": why,
                "resolve": "es-agents provide-input RUN --input '<result JSON>'",
            }
        ),
    )
    loop.flush()


_UNCERTAIN: Any = object()
_TOOL_THREADS = DaemonPool("tool")


class _TimedOut(Exception):
    pass


def _args(args_json: str) -> dict[str, JsonValue]:

    value = json.loads(args_json)
    return value if isinstance(value, dict) else {"_value": value}
