"""Model steps: the request made durable, the call, the completion recorded.

Invariant 3: a recorded completion is never asked for again; a dangling request may
be re-issued, and every retry is requested again first (``attempt`` + 1), so every
call the model saw is in the log. Only the model's own failures are retried.

Streaming: a model client with ``astream`` hands the answer's text over in pieces
while the call is in flight; each piece is published as a ``Delta`` (between a
``start`` and an ``end`` marker naming the call's step and attempt) for watchers.
Only the whole completion becomes an event, as without streaming.
"""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import Any

from es_agents.core.events import ModelCallRequested, ModelResponded
from es_agents.core.state import RunState
from es_agents.core.step import CallModel, canonical_json, request_hash
from es_agents.core.transcript import Conversation
from es_agents.errors import (
    ConfigError,
    ModelError,
    RateLimited,
    RetryableToolError,
    RunError,
    Unavailable,
)
from es_agents.models import Completion, ModelClient
from es_agents.ports import Delta, DeltaKind, Deltas
from es_agents.retry import aretrying
from es_agents.runtime import pacing
from es_agents.runtime.context import Stepping

log = logging.getLogger(__name__)

MODEL_TRIES = 5


class _ModelUnavailable(Unavailable):
    """The model out of reach -- not the log or the database, whose
    ``Unavailable`` is the worker's (crash-only), never a run's failure."""


async def call_model(
    loop: Stepping, state: RunState, step: CallModel, attempt: int
) -> None:
    """Request (durable), call, record. Each retry of the call is requested
    again first (``attempt`` + 1), so every call the model saw is in the log."""
    model = loop.agent.model
    if model is None:
        raise RunError(
            "planner_error",
            f"agent {loop.agent.name} asked for a model but has none",
        )
    policy = aretrying(MODEL_TRIES, on=(Unavailable, RetryableToolError))
    try:
        async for tried in policy:
            # The request is outside the retried block: only the model's own
            # failures are retried, never the log's or the database's.
            number = attempt + tried.retry_state.attempt_number - 1
            call = (state.step + 1, number)  # the request's step and attempt
            await _request(loop, state, step, model.model_id, number)
            await _read_conversation(loop, step)
            with tried:
                try:
                    completion = await pacing.in_turn(
                        loop.ctx,
                        model.model_id,
                        partial(_timed, loop, model, step, call),
                    )
                except RateLimited as e:  # 429s for longer than pacing's patience
                    raise _ModelUnavailable(str(e)) from e
    except _ModelUnavailable as e:
        raise RunError(
            "model_unavailable", f"{e} (gave up after {MODEL_TRIES} tries)"
        ) from e
    except RetryableToolError as e:  # e.g. an answer that does not parse
        raise RunError("model_error", f"{e} (gave up after {MODEL_TRIES} tries)") from e
    loop.ctx.probe.hit("after_action:model")
    calls = completion.tool_calls
    if loop.ctx.redactor is not None:  # secret arguments: tokens from here on
        calls = loop.ctx.redactor.seal_calls(loop.actor.run_id, calls)
    loop.add(
        ModelResponded,
        content=completion.content,
        tool_calls=calls,
        finish_reason=completion.finish_reason,
        usage=completion.usage,
        model_id=completion.model_id,
    )
    # The outcome goes out with the next step's intention: one ack per step.


async def _request(
    loop: Stepping, state: RunState, step: CallModel, model_id: str, attempt: int
) -> None:
    loop.add(
        ModelCallRequested,
        step=state.step + 1,
        messages_hash=request_hash(step, model_id),
        message_count=len(step.messages),
        params_json=canonical_json({"model": model_id, **step.params}),
        attempt=attempt,
    )
    await loop.flush()  # write-ahead: the intention (and the last outcome) durable


async def _read_conversation(loop: Stepping, step: CallModel) -> None:
    """A resumed run's stored messages, read before the model is called: failing to
    read them is the database's failure (the worker's: crash-only), not the
    model's, which would be retried and then fail the run."""
    if isinstance(step.messages, Conversation):
        await loop.ctx.io(step.messages.transcript.read_all)


async def _timed(
    loop: Stepping, model: ModelClient, step: CallModel, call: tuple[int, int]
) -> Completion:
    """``_complete``, its latency and outcome reported to the telemetry. ``call``:
    the request's step and attempt."""
    started = time.perf_counter()
    ok = False
    try:
        with loop.ctx.tracer.model_call(model.model_id) as span:
            completion = await _complete(loop, model, step, call)
            span.set("gen_ai.response.model", completion.model_id or model.model_id)
            span.set("gen_ai.usage.input_tokens", completion.usage.prompt_tokens)
            span.set("gen_ai.usage.output_tokens", completion.usage.completion_tokens)
            if completion.finish_reason:
                span.set("gen_ai.response.finish_reasons", completion.finish_reason)
        ok = True
        return completion
    finally:
        loop.ctx.telemetry.model_call(
            loop.agent.name, model.model_id, time.perf_counter() - started, ok
        )


async def _complete(
    loop: Stepping, model: ModelClient, step: CallModel, call: tuple[int, int]
) -> Completion:
    """One call. ``Unavailable`` and ``RetryableToolError`` are retried by the
    caller; a refusal or a client bug ends the run (``model_error``)."""
    try:
        completion = await _ask(loop, model, step, call)
    except RateLimited:
        raise  # a turn to wait for (``pacing``), not a failure of the call
    except Unavailable as e:
        log.warning("run %s: model call failed (%s)", loop.actor.run_id, e)
        raise _ModelUnavailable(str(e)) from e
    except RetryableToolError as e:
        log.warning("run %s: model call failed (%s)", loop.actor.run_id, e)
        raise
    except (ModelError, ConfigError) as e:
        raise RunError("model_error", f"model refused the call: {e}") from e
    except Exception as e:
        raise RunError("model_error", f"{type(e).__name__}: {e}") from e
    if not isinstance(completion, Completion):
        raise RunError(
            "model_error",
            f"model returned {type(completion).__name__}, not a Completion",
        )
    return completion


async def _ask(
    loop: Stepping, model: ModelClient, step: CallModel, call: tuple[int, int]
) -> Completion:
    """An async client (``acomplete``, e.g. on an SDK's async client) is awaited on
    the event loop; a sync one runs on a thread of the worker's bounded pool; one
    that streams (``astream``) does when the run's deltas go somewhere."""
    astream = getattr(model, "astream", None)
    deltas = loop.ctx.deltas
    if astream is not None and deltas is not None:
        return await _streamed(loop.actor.run_id, deltas, astream, step, call)
    acomplete = getattr(model, "acomplete", None)
    if acomplete is not None:
        completion: Completion = await acomplete(step.messages, step.params, step.tools)
        return completion
    return await loop.ctx.calls.run(
        lambda: model.complete(step.messages, step.params, step.tools)
    )


async def _streamed(
    run_id: str,
    deltas: Deltas,
    astream: Any,
    step: CallModel,
    call: tuple[int, int],
) -> Completion:
    """The call streamed: a ``start`` marker, each piece of text as it comes, an
    ``end`` marker (with the reason when the call failed). Publishing never waits
    and never fails the call."""
    number, attempt = call

    def publish(kind: DeltaKind, text: str = "") -> None:
        try:
            deltas.publish(Delta(run_id, number, attempt, kind, text, time.time()))
        except Exception as e:
            log.debug("run %s: a delta was not published: %s", run_id, e)

    publish("start")
    try:
        completion: Completion = await astream(
            step.messages, step.params, step.tools, lambda text: publish("text", text)
        )
    except BaseException as e:
        publish("end", f"{type(e).__name__}: {e}"[:300])
        raise
    publish("end")
    return completion
