"""Tool steps: the call with its idempotency key, the dedupe table for tools that
cannot honor keys, and reconciliation of a call whose outcome the log lacks.

Invariant 4: an effect happens at most once per key. A dangling
``tool_call_requested`` is settled by the downstream's lookup, a retry the downstream
dedupes, or the ledger; when none can tell, the run pauses (``uncertain_effect``)
for a person -- never a silent second call.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable
from typing import Any

from pydantic import JsonValue

from es_agents.core.events import Interrupted, ToolCallRequested, ToolReturned
from es_agents.core.state import PendingToolCall, RunState
from es_agents.core.step import CallTool, CallTools, canonical_json
from es_agents.errors import (
    AppendError,
    EffectUnknown,
    FencedError,
    RetryableToolError,
    TerminalToolError,
    Unavailable,
)
from es_agents.retry import aretrying
from es_agents.runtime import children
from es_agents.runtime.context import Stepping
from es_agents.runtime.pools import Overdue
from es_agents.tools import Lookup, Tool, ToolContext

log = logging.getLogger(__name__)

TOOL_TRIES = 3


async def call_tool(loop: Stepping, state: RunState, step: CallTool) -> None:
    number, key = _request(loop, state, step)
    await loop.flush()  # write-ahead: nothing happens downstream before it is durable
    result, error = await _perform(loop, state.run_id, step, number, key)
    if isinstance(result, children.Started):
        children.record(loop, step.call_id, result)
        return
    if result is _UNCERTAIN:
        await uncertain(loop, state, key, step.tool, step.call_id, why=error)
        return
    loop.add(ToolReturned, call_id=step.call_id, result_json=result, error=error)


async def call_tools(loop: Stepping, state: RunState, step: CallTools) -> None:
    """Several calls at once: every intention in one append, then the calls run
    concurrently (at most ``tool_calls_per_run`` of the run at a time); each
    outcome is made durable as it comes, batched with whatever else the partition
    appends. A call whose effect is uncertain pauses the run once the others have
    returned."""
    requested = [(call, *_request(loop, state, call)) for call in step.calls]
    await loop.flush()  # write-ahead: every intention durable before any call
    slots = asyncio.Semaphore(loop.ctx.tool_calls_per_run)
    unsure: list[tuple[CallTool, str, str | None]] = []

    async def one(call: CallTool, number: int, key: str) -> None:
        async with slots:
            result, error = await _perform(loop, state.run_id, call, number, key)
        if isinstance(result, children.Started):
            children.record(loop, call.call_id, result)
            await loop.flush()
            return
        if result is _UNCERTAIN:
            unsure.append((call, key, error))
            return
        loop.add(ToolReturned, call_id=call.call_id, result_json=result, error=error)
        await loop.flush()

    try:
        async with asyncio.TaskGroup() as group:
            for call, number, key in requested:
                group.create_task(one(call, number, key))
    except BaseExceptionGroup as e:  # the first failure as it is (fenced, gone...)
        raise _first(e) from None
    if unsure:
        call, key, why = unsure[0]
        await uncertain(loop, state, key, call.tool, call.call_id, why=why)


def _request(loop: Stepping, state: RunState, step: CallTool) -> tuple[int, str]:
    """Add the call's intention; its step number and idempotency key."""
    number = (loop.state.step if loop.state is not None else state.step) + 1
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
    return number, key


async def _perform(
    loop: Stepping, run_id: str, step: CallTool, number: int, key: str
) -> tuple[Any, str | None]:
    """The call (its intention durable): result and error, or ``_UNCERTAIN``."""
    tool = loop.agent.tools.get(step.tool)
    result: Any
    error: str | None
    if tool is None:
        result, error = None, f"unknown tool {step.tool!r}"
    elif tool.child_agent is not None:  # the effect: the child run's start
        result, error = (
            await children.start(loop, run_id, step, key, tool.child_agent),
            None,
        )
    else:
        ctx = context(loop, run_id, number, key)
        with loop.ctx.tracer.tool_call(step.tool, step.call_id) as span:
            result, error = await invoke(loop, tool, step.args, ctx)
            if error is not None:
                span.set("error.type", "tool_error")
    loop.ctx.probe.hit("after_action:tool")
    return result, error


def _first(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The failure to raise for a group: the worker's kinds first (the log or the
    database gone, the partition lost), then the first."""
    leaves: list[BaseException] = []

    def walk(e: BaseException) -> None:
        if isinstance(e, BaseExceptionGroup):
            for inner in e.exceptions:
                walk(inner)
        else:
            leaves.append(e)

    walk(group)
    for kind in (Unavailable, AppendError, FencedError):
        for leaf in leaves:
            if isinstance(leaf, kind):
                return leaf
    return leaves[0]


def context(
    loop: Stepping, run_id: str, step: int, key: str, attempt: int = 1
) -> ToolContext:
    return ToolContext(
        run_id, step, key, attempt, partition=loop.actor.partition, epoch=loop.epoch
    )


async def invoke(
    loop: Stepping,
    tool: Tool[Any],
    args: dict[str, JsonValue],
    ctx: ToolContext,
) -> tuple[Any, str | None]:
    """Call the tool (through the dedupe table when it needs one)."""
    ledger, io = loop.ctx.ledger, loop.ctx.io
    if tool.needs_dedupe_table:
        record = await io(
            ledger.begin, ctx.idempotency_key, ctx.run_id, ctx.step, tool.name
        )
        if record.status == "done":
            return record.result_json, record.error
        if record.status == "started":
            return _UNCERTAIN, None
        loop.ctx.probe.hit("after_claim:tool")
    try:
        result, error = await _call(loop, tool, args, ctx)
    except FencedError:
        if tool.needs_dedupe_table:  # refused downstream: the call did not happen
            await io(ledger.release, ctx.idempotency_key)
        raise
    if tool.needs_dedupe_table and result is not _UNCERTAIN:
        await io(ledger.finish, ctx.idempotency_key, result, error)
    return result, error


async def _call(  # noqa: PLR0911 - one return per outcome of a call
    loop: Stepping,
    tool: Tool[Any],
    args: dict[str, JsonValue],
    ctx: ToolContext,
) -> tuple[str | None, str | None]:
    redactor = loop.ctx.redactor
    try:
        if redactor is not None:  # the tool gets its secrets' real values
            args = redactor.open_args(ctx.run_id, tool.name, args)
        try:  # the first try without the retry policy's machinery (the usual case)
            value = await _run_tool(loop, tool, args, ctx)
        except RetryableToolError:
            value = await _retry_tool(loop, tool, args, ctx)
        if redactor is not None:  # and what it returns as secret is sealed
            value = redactor.seal_result(ctx.run_id, value)
        result = canonical_json(value)
    except _TimedOut:
        if tool.side_effect:  # it may still happen: a person decides
            return _UNCERTAIN, f"timed out after {tool.timeout} s"
        return None, f"timed out after {tool.timeout} s"
    except EffectUnknown as e:
        if tool.side_effect:  # it may have happened: a person decides
            return _UNCERTAIN, str(e)
        return None, str(e)
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


async def _retry_tool(
    loop: Stepping, tool: Tool[Any], args: dict[str, JsonValue], ctx: ToolContext
) -> JsonValue:
    """The tries after a first ``RetryableToolError``, with the retry policy's
    waits (the last error is raised)."""
    async for tried in aretrying(
        TOOL_TRIES - 1, on=(RetryableToolError,), maximum=2.0, wait_first=True
    ):
        with tried:
            return await _run_tool(loop, tool, args, ctx)
    raise AssertionError("unreachable: the policy raises its last error")


async def _run_tool(
    loop: Stepping, tool: Tool[Any], args: dict[str, JsonValue], ctx: ToolContext
) -> JsonValue:
    """Call the tool, waiting at most its timeout: an ``async def`` tool on the
    event loop (cancelled past its timeout), a plain one on a daemon thread of the
    worker's bounded pool (left to finish past it: Python cannot stop a thread)."""
    calls = loop.ctx.calls
    try:
        call = tool(args, ctx) if tool.is_async else None
        if isinstance(call, Awaitable):
            result: JsonValue = await calls.wait(call, tool.timeout)
            return result
        return await calls.run(lambda: _sync(tool(args, ctx)), tool.timeout)
    except Overdue as e:
        log.warning(
            "run %s: tool %s timed out after %s s",
            ctx.run_id,
            tool.name,
            tool.timeout,
        )
        raise _TimedOut from e


async def reconcile(loop: Stepping, state: RunState, pending: PendingToolCall) -> None:
    """A ``tool_call_requested`` with no outcome: find out what happened by key,
    and record it as ``tool_returned`` marked reconciled (or pause, uncertain)."""
    tool = loop.agent.tools.get(pending.tool)
    if tool is not None and tool.child_agent is not None:  # started again: a no-op
        call = CallTool(pending.call_id, pending.tool, _args(pending.args_json))
        key = pending.idempotency_key
        started = await children.start(loop, state.run_id, call, key, tool.child_agent)
        children.record(loop, pending.call_id, started)
        return
    outcome = await _reconciled_outcome(loop, state, pending)
    if outcome is not None and outcome[0] is _UNCERTAIN:
        await uncertain(
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


async def _reconciled_outcome(  # noqa: PLR0911 - one return per way of knowing
    loop: Stepping, state: RunState, pending: PendingToolCall
) -> tuple[str | None, str | None] | None:
    key = pending.idempotency_key
    resume = state.last_resume
    if (
        resume is not None
        and resume.reason == "input"
        and resume.seq > max(pending.seq, state.last_outcome_seq)
    ):
        return resume.input_json, None  # a person settled an uncertain effect
    tool = loop.agent.tools.get(pending.tool)
    if tool is None:
        return None, f"unknown tool {pending.tool!r}"
    ctx = context(loop, state.run_id, pending.step, key, attempt=2)
    args = _args(pending.args_json)
    if not tool.side_effect:
        return await _call(loop, tool, args, ctx)
    if tool.lookup is not None:
        found = await loop.ctx.calls.run(lambda: tool.lookup(key))
        if found.status == "done":
            return canonical_json(found.result), None
        if found.status == "absent" and tool.honors_idempotency_key:
            return await _call(loop, tool, args, ctx)
        await uncertain(loop, state, key, pending.tool, pending.call_id, found)
        return None
    if tool.honors_idempotency_key:
        # The downstream dedupes by key: calling again returns the first result.
        return await _call(loop, tool, args, ctx)
    record = await loop.ctx.io(loop.ctx.ledger.get, key)
    if record is None:  # the call never started: the ledger row comes first
        result, error = await invoke(loop, tool, args, ctx)
        if result is not _UNCERTAIN:
            return result, error
    elif record.status == "done":
        return record.result_json, record.error
    await uncertain(loop, state, key, pending.tool, pending.call_id)
    return None


async def uncertain(  # noqa: PLR0917 - what a person needs to settle it
    loop: Stepping,
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
    await loop.flush()


_UNCERTAIN: Any = object()


class _TimedOut(Exception):
    pass


def _sync(value: JsonValue | Awaitable[JsonValue]) -> JsonValue:
    if isinstance(value, Awaitable):  # an async tool not declared as one
        raise TerminalToolError("the tool returned an awaitable from a plain call")
    return value


def _args(args_json: str) -> dict[str, JsonValue]:

    value = json.loads(args_json)
    return value if isinstance(value, dict) else {"_value": value}
