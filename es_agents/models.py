"""Model clients behind one interface (``ModelClient``), and a scripted model for
tests and the demo (no model API is reachable from CI). The adapters for real models
use the official SDKs: ``es_agents.adapters.openai_model.OpenAIChatModel`` (any
OpenAI-compatible server) and ``es_agents.adapters.anthropic_model.AnthropicModel``."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from types import ModuleType
from typing import Protocol, TypeVar

from pydantic import JsonValue

from es_agents.core.events import ToolCall, Usage
from es_agents.core.step import (
    CallModel,
    Message,
    ToolSpec,
    canonical_json,
    request_hash,
)
from es_agents.core.transcript import canonical_bytes
from es_agents.errors import ModelError, RateLimited, RetryableToolError, Unavailable


@dataclass(frozen=True)
class Completion:
    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str = "stop"
    usage: Usage = field(default_factory=Usage)
    model_id: str = ""


class ModelClient(Protocol):
    """One chat completion. Raises ``Unavailable`` when it may work later (with
    ``retry_after`` when the server said), ``ModelError`` when it will not, and
    ``RetryableToolError`` for an answer that does not parse. A client may also
    offer ``async def acomplete`` with the same arguments: the worker then awaits
    it on its event loop instead of calling ``complete`` on a thread."""

    model_id: str

    def complete(
        self,
        messages: Sequence[Message],
        params: dict[str, JsonValue],
        tools: Sequence[ToolSpec] = (),
    ) -> Completion: ...


def status_error(
    model_id: str, status: int, body: object, response: object
) -> Exception:
    """What an SDK's HTTP error means to the runtime: ``Unavailable`` (408, 409, 429,
    5xx: retry, after ``Retry-After`` when given) or ``ModelError`` (do not)."""
    message = json.dumps(body, default=str)[:500]
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and "message" in error:
            message = str(error["message"])[:500]
    detail = f"model {model_id}: HTTP {status}: {message}"
    if status == 429:
        return RateLimited(detail, retry_after_seconds(response))
    if status in (408, 409) or status >= 500:
        return Unavailable(detail, retry_after_seconds(response))
    return ModelError(detail)


def retry_after_seconds(response: object) -> float | None:
    """Seconds a server asked to wait (``retry-after-ms`` or ``Retry-After``: seconds
    or an HTTP date), from an httpx response; None when it did not say."""
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


Turn = Completion | Callable[[Sequence[Message]], Completion]


class ScriptedModel:
    """Answers turn n of a run with ``script[n]``, where n counts the assistant
    messages already in the transcript, so a re-issued call gets the same answer.

    Every call is appended to ``calls_log`` (one JSON line per call) when given, so a
    test can count calls issued across worker processes.
    """

    def __init__(
        self,
        script: Sequence[Turn],
        model_id: str = "scripted",
        calls_log: Path | None = None,
        delay: float = 0.0,
    ) -> None:
        self.script = list(script)
        self.model_id = model_id
        self.calls_log = calls_log
        self.delay = delay
        self._lock = threading.Lock()
        self.calls: list[str] = []

    def complete(
        self,
        messages: Sequence[Message],
        params: dict[str, JsonValue],
        tools: Sequence[ToolSpec] = (),
    ) -> Completion:
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        # The same hash the run records in model_call_requested for this call.
        digest = request_hash(CallModel(messages, params, tuple(tools)), self.model_id)
        with self._lock:
            self.calls.append(digest)
            if self.calls_log is not None:
                with self.calls_log.open("a") as out:
                    out.write(canonical_json({"hash": digest, "turn": turn}) + "\n")
        if self.delay:
            time.sleep(self.delay)
        if turn >= len(self.script):
            return Completion(
                content="(the script has no more turns)", model_id=self.model_id
            )
        answer = self.script[turn]
        completion = answer(messages) if callable(answer) else answer
        tokens = len(canonical_bytes(list(messages)).decode()) // 4
        return Completion(
            content=completion.content,
            tool_calls=completion.tool_calls,
            finish_reason="tool_calls" if completion.tool_calls else "stop",
            usage=Usage(prompt_tokens=tokens, completion_tokens=8),
            model_id=self.model_id,
        )


class StreamingScriptedModel(ScriptedModel):
    """A ``ScriptedModel`` that streams: each answer's text in pieces of
    ``piece_chars`` characters, ``piece_gap`` seconds apart (``astream``)."""

    def __init__(
        self,
        script: Sequence[Turn],
        model_id: str = "scripted",
        calls_log: Path | None = None,
        piece_chars: int = 6,
        piece_gap: float = 0.0,
    ) -> None:
        super().__init__(script, model_id, calls_log)
        self.piece_chars = piece_chars
        self.piece_gap = piece_gap

    async def astream(
        self,
        messages: Sequence[Message],
        params: dict[str, JsonValue],
        tools: Sequence[ToolSpec],
        on_text: Callable[[str], None],
    ) -> Completion:
        import asyncio  # noqa: PLC0415

        completion = self.complete(messages, params, tools)
        text, n = completion.content or "", self.piece_chars
        for i in range(0, len(text), n):
            if self.piece_gap:
                await asyncio.sleep(self.piece_gap)
            on_text(text[i : i + n])
        return completion


def reply(content: str) -> Completion:
    return Completion(content=content)


def call(name: str, call_id: str, **args: JsonValue) -> Completion:
    return Completion(
        content=None,
        tool_calls=(
            ToolCall(call_id=call_id, name=name, args_json=canonical_json(args)),
        ),
    )


R = TypeVar("R")


@contextlib.contextmanager
def sdk_errors(sdk: ModuleType, model_id: str) -> Iterator[None]:
    """An official SDK's errors (``openai`` and ``anthropic`` name them alike) as the
    runtime's: ``status_error`` for an HTTP status, ``Unavailable`` for a connection
    or a timeout, ``RetryableToolError`` for a body that does not parse."""
    try:
        yield
    except sdk.APIStatusError as e:
        raise status_error(model_id, e.status_code, e.body, e.response) from e
    except sdk.APIConnectionError as e:  # timeouts included
        raise Unavailable(f"model {model_id}: {e}") from e
    except (sdk.APIResponseValidationError, ValueError) as e:  # bad JSON too
        raise RetryableToolError(f"unparsable model response: {e}") from e


def parsed(
    convert: Callable[[R, str], Completion], response: R, model_id: str
) -> Completion:
    """``convert(response, model_id)``; a response of the wrong shape is an answer
    that does not parse (retried by the runtime's policy)."""
    try:
        return convert(response, model_id)
    except (AttributeError, TypeError, KeyError, IndexError, ValueError) as e:
        raise RetryableToolError(f"unparsable model response: {e!r}") from e
