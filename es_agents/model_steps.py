"""Model steps: the request made durable, the call, the completion recorded.

Invariant 3: a recorded completion is never asked for again; a dangling request may
be re-issued, and every retry is requested again first (``attempt`` + 1), so every
call the model saw is in the log. Only the model's own failures are retried.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from es_agents.core.events import ModelCallRequested, ModelResponded
from es_agents.core.state import RunState
from es_agents.core.step import CallModel, canonical_json, request_hash
from es_agents.core.transcript import Conversation
from es_agents.errors import (
    ConfigError,
    ModelError,
    RetryableToolError,
    RunError,
    Unavailable,
)
from es_agents.models import Completion, ModelClient
from es_agents.retry import retrying

if TYPE_CHECKING:
    from es_agents.run_loop import RunLoop

log = logging.getLogger(__name__)

MODEL_TRIES = 5


class _ModelUnavailable(Unavailable):
    """The model out of reach -- not the log or the database, whose
    ``Unavailable`` is the worker's (crash-only), never a run's failure."""


def call_model(loop: RunLoop, state: RunState, step: CallModel, attempt: int) -> None:
    """Request (durable), call, record. Each retry of the call is requested
    again first (``attempt`` + 1), so every call the model saw is in the log."""
    model = loop.agent.model
    if model is None:
        raise RunError(
            "planner_error",
            f"agent {loop.agent.name} asked for a model but has none",
        )
    policy = retrying(MODEL_TRIES, on=(Unavailable, RetryableToolError))
    try:
        for tried in policy:
            # The request is outside the retried block: only the model's own
            # failures are retried, never the log's or the database's.
            number = attempt + tried.retry_state.attempt_number - 1
            _request(loop, state, step, model.model_id, number)
            _read_conversation(step)
            with tried:
                completion = _timed(loop, model, step)
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


def _request(
    loop: RunLoop, state: RunState, step: CallModel, model_id: str, attempt: int
) -> None:
    loop.add(
        ModelCallRequested,
        step=state.step + 1,
        messages_hash=request_hash(step, model_id),
        message_count=len(step.messages),
        params_json=canonical_json({"model": model_id, **step.params}),
        attempt=attempt,
    )
    loop.flush()  # write-ahead: the intention (and the last outcome) are durable


def _read_conversation(step: CallModel) -> None:
    """A resumed run's stored messages, read before the model is called: failing to
    read them is the database's failure (the worker's: crash-only), not the
    model's, which would be retried and then fail the run."""
    if isinstance(step.messages, Conversation):
        step.messages.transcript.read_all()


def _timed(loop: RunLoop, model: ModelClient, step: CallModel) -> Completion:
    """``_complete``, its latency and outcome reported to the telemetry."""
    started = time.perf_counter()
    ok = False
    try:
        with loop.ctx.tracer.model_call(model.model_id) as span:
            completion = _complete(loop, model, step)
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


def _complete(loop: RunLoop, model: ModelClient, step: CallModel) -> Completion:
    """One call. ``Unavailable`` and ``RetryableToolError`` are retried by the
    caller; a refusal or a client bug ends the run (``model_error``)."""
    try:
        completion = model.complete(step.messages, step.params, step.tools)
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
