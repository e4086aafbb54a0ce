"""Model clients behind one interface: an OpenAI-compatible HTTP adapter, and a
scripted model for tests and the demo (no model API is reachable from CI)."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, final

from pydantic import JsonValue

from es_agents.core.events import ToolCall, Usage
from es_agents.core.step import Message, canonical_json, messages_hash
from es_agents.errors import ModelError, RetryableToolError, Unavailable


@dataclass(frozen=True)
class Completion:
    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str = "stop"
    usage: Usage = field(default_factory=Usage)
    model_id: str = ""


class ModelClient(Protocol):
    """One chat completion; raises ``Unavailable`` when it may work later."""

    model_id: str

    def complete(
        self, messages: Sequence[Message], params: dict[str, JsonValue]
    ) -> Completion: ...


@final
class OpenAIChatModel:
    """Chat completions over HTTP (OpenAI, vLLM, llama.cpp server, ...)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout: float = 120.0,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model_id = model
        self._api_key = api_key
        self._timeout = timeout

    def complete(
        self, messages: Sequence[Message], params: dict[str, JsonValue]
    ) -> Completion:
        body = {"model": self.model_id, "messages": list(messages), **params}
        request = urllib.request.Request(  # noqa: S310 - http(s) from settings
            f"{self.base_url}/chat/completions",
            data=json.dumps(body).encode(),
            headers={
                "Content-Type": "application/json",
                **(
                    {"Authorization": f"Bearer {self._api_key}"}
                    if self._api_key
                    else {}
                ),
            },
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=self._timeout) as response:  # noqa: S310
                payload = json.loads(response.read())
        except urllib.error.HTTPError as e:
            if e.code in (408, 429) or e.code >= 500:
                raise Unavailable(f"model {self.model_id}: HTTP {e.code}") from e
            raise ModelError(
                f"model {self.model_id}: HTTP {e.code}: {e.read()[:500]!r}"
            ) from e
        except (urllib.error.URLError, TimeoutError) as e:
            raise Unavailable(f"model {self.model_id}: {e}") from e
        return parse_chat_completion(payload, self.model_id)


def parse_chat_completion(payload: dict[str, object], model_id: str) -> Completion:
    """The OpenAI response shape; an unparsable one is a retryable model error."""
    try:
        choice = payload["choices"][0]  # type: ignore[index]
        message = choice["message"]
        calls = tuple(
            ToolCall(
                call_id=c["id"],
                name=c["function"]["name"],
                args_json=c["function"]["arguments"] or "{}",
            )
            for c in message.get("tool_calls") or ()
        )
        usage: Any = payload.get("usage") or {}
        return Completion(
            content=message.get("content"),
            tool_calls=calls,
            finish_reason=choice.get("finish_reason") or "stop",
            usage=Usage(
                prompt_tokens=int(usage.get("prompt_tokens", 0)),
                completion_tokens=int(usage.get("completion_tokens", 0)),
            ),
            model_id=str(payload.get("model") or model_id),
        )
    except (KeyError, IndexError, TypeError, AttributeError, ValueError) as e:
        raise RetryableToolError(f"unparsable model response: {e!r}") from e


Turn = Completion | Callable[[Sequence[Message]], Completion]


@final
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
        self, messages: Sequence[Message], params: dict[str, JsonValue]
    ) -> Completion:
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        digest = messages_hash(messages)
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
        tokens = len(canonical_json(list(messages))) // 4
        return Completion(
            content=completion.content,
            tool_calls=completion.tool_calls,
            finish_reason="tool_calls" if completion.tool_calls else "stop",
            usage=Usage(prompt_tokens=tokens, completion_tokens=8),
            model_id=self.model_id,
        )


def reply(content: str) -> Completion:
    return Completion(content=content)


def call(name: str, call_id: str, **args: JsonValue) -> Completion:
    return Completion(
        content=None,
        tool_calls=(
            ToolCall(call_id=call_id, name=name, args_json=canonical_json(args)),
        ),
    )
