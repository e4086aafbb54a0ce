"""Chat completions through the official ``openai`` SDK, for any OpenAI-compatible
server: OpenAI, vLLM, Ollama, llama.cpp's server, a LiteLLM proxy.

The run's transcript (the fold's neutral messages) becomes the API's message params:
assistant tool calls as ``{id, type: "function", function: {name, arguments}}`` and
tool results as ``{role: "tool", tool_call_id, content}``. Tools are sent as function
tools with their JSON Schema. The SDK's own retries are off (``max_retries=0``): the
runtime's one retry policy decides, and records each attempt. ``astream`` streams the
answer (``stream=True``, usage asked for in the last chunk) and hands each piece of
text to a callback while the SDK's own accumulator builds the whole completion.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, final

from pydantic import JsonValue

from es_agents.core.events import ToolCall, Usage
from es_agents.core.step import Message, ToolSpec
from es_agents.errors import RetryableToolError, Unavailable
from es_agents.models import Completion, parsed, sdk_errors

if TYPE_CHECKING:
    from openai import AsyncOpenAI, OpenAI
    from openai.types.chat import (
        ChatCompletion,
        ChatCompletionMessageParam,
        ChatCompletionToolUnionParam,
    )


def to_openai_messages(messages: Sequence[Message]) -> list[ChatCompletionMessageParam]:
    """The fold's neutral transcript in the Chat Completions wire shape."""
    out: list[Any] = []
    for m in messages:
        role = m.get("role")
        if role == "assistant":
            message: dict[str, Any] = {"role": "assistant", "content": m.get("content")}
            calls = m.get("tool_calls")
            if isinstance(calls, list) and calls:
                message["tool_calls"] = [
                    {
                        "id": c["call_id"],
                        "type": "function",
                        "function": {"name": c["name"], "arguments": c["args_json"]},
                    }
                    for c in calls
                    if isinstance(c, dict)
                ]
            out.append(message)
        elif role == "tool":
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": m.get("tool_call_id"),
                    "content": str(m.get("content") or ""),
                }
            )
        else:
            out.append({"role": role, "content": str(m.get("content") or "")})
    return out


def to_openai_tools(tools: Sequence[ToolSpec]) -> list[ChatCompletionToolUnionParam]:
    return [
        {
            "type": "function",
            "function": {
                "name": str(t["name"]),
                "description": str(t.get("description") or ""),
                "parameters": t.get("parameters") or {"type": "object"},  # type: ignore[typeddict-item]
            },
        }
        for t in tools
    ]


def from_openai(response: ChatCompletion, requested_model: str) -> Completion:
    if not response.choices:
        raise RetryableToolError("unparsable model response: no choices")
    choice = response.choices[0]
    message = choice.message
    calls = tuple(
        ToolCall(
            call_id=c.id,
            name=c.function.name,
            args_json=c.function.arguments or "{}",
        )
        for c in message.tool_calls or ()
        if c.type == "function"
    )
    usage = response.usage
    return Completion(
        content=message.content,
        tool_calls=calls,
        finish_reason=choice.finish_reason or "stop",
        usage=Usage(
            prompt_tokens=usage.prompt_tokens if usage else 0,
            completion_tokens=usage.completion_tokens if usage else 0,
        ),
        model_id=response.model or requested_model,
    )


@final
class OpenAIChatModel:
    """``complete`` raises ``Unavailable`` (connection, timeout, 408/409/429/5xx:
    retry), ``ModelError`` (another 4xx: do not), ``RetryableToolError`` (a body
    that does not parse). ``acomplete`` is the same on the SDK's async client: the
    worker awaits it on its event loop, no thread per call."""

    def __init__(
        self,
        base_url: str | None,
        model: str,
        api_key: str | None = None,
        timeout: float = 120.0,
    ) -> None:
        from openai import OpenAI  # noqa: PLC0415 - the SDK loads only when used

        self.model_id = model
        self._options: dict[str, Any] = {
            "base_url": base_url,
            "api_key": api_key or "not-needed",  # local servers take any key
            "timeout": timeout,
            "max_retries": 0,
        }
        self._client: OpenAI = OpenAI(**self._options)
        self._async: AsyncOpenAI | None = None  # made on the loop that awaits it

    def _request(
        self,
        messages: Sequence[Message],
        params: dict[str, JsonValue],
        tools: Sequence[ToolSpec],
    ) -> dict[str, Any]:
        return {
            "model": self.model_id,
            "messages": to_openai_messages(messages),
            "stream": False,
            **({"tools": to_openai_tools(tools)} if tools else {}),
            **params,
        }

    def complete(
        self,
        messages: Sequence[Message],
        params: dict[str, JsonValue],
        tools: Sequence[ToolSpec] = (),
    ) -> Completion:
        with self._translated():
            response: ChatCompletion = self._client.chat.completions.create(
                **self._request(messages, params, tools)
            )
        return self._parse(response)

    def _aclient(self) -> AsyncOpenAI:
        if self._async is None:
            from openai import AsyncOpenAI  # noqa: PLC0415

            self._async = AsyncOpenAI(**self._options)
        return self._async

    async def acomplete(
        self,
        messages: Sequence[Message],
        params: dict[str, JsonValue],
        tools: Sequence[ToolSpec] = (),
    ) -> Completion:
        client = self._aclient()
        with self._translated():
            response: ChatCompletion = await client.chat.completions.create(
                **self._request(messages, params, tools)
            )
        return self._parse(response)

    async def astream(
        self,
        messages: Sequence[Message],
        params: dict[str, JsonValue],
        tools: Sequence[ToolSpec],
        on_text: Callable[[str], None],
    ) -> Completion:
        """``acomplete``, streamed: ``on_text`` gets each piece of the answer's text
        as it comes; the completion returned is the whole answer. The SDK builds
        the request and translates errors; the server-sent events are read as
        lines and parsed with orjson here (the SDK's typed chunks cost ~80 µs
        each, these ~6: ``es-agents bench stream``)."""
        client = self._aclient()
        request = {
            **self._request(messages, params, tools),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        assembled = _Assembled(self.model_id)
        create = client.chat.completions.with_streaming_response.create
        with self._translated():
            async with create(**request) as response:
                kind = response.headers.get("content-type", "")
                if "text/event-stream" not in kind:
                    # A server that does not stream answered whole: read that (the
                    # call is made; asking again would bill it twice).
                    whole = _whole(await response.read())
                    text = _content(whole)
                    if text:
                        on_text(text)
                    return self._parse(whole)
                async for line in response.iter_lines():
                    if not line.startswith("data:"):
                        continue  # blank lines, comments, event names
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    piece = assembled.add(_chunk(data))
                    if piece:
                        on_text(piece)
        return assembled.completion()

    @contextlib.contextmanager
    def _translated(self) -> Iterator[None]:
        import openai  # noqa: PLC0415 - the SDK loads only when used

        with sdk_errors(openai, self.model_id):
            yield

    def _parse(self, response: ChatCompletion) -> Completion:
        return parsed(from_openai, response, self.model_id)


class _Assembled:
    """A streamed answer put together chunk by chunk: the text, the tool calls
    (by index: id and name first, then pieces of the arguments), why it stopped,
    the usage (in the last chunk) and the model that answered."""

    def __init__(self, requested_model: str) -> None:
        self.model_id = requested_model
        self.text: list[str] = []
        self.calls: dict[int, list[str]] = {}  # index -> [id, name, *arguments]
        self.finish = "stop"
        self.usage = Usage()
        self.answered = False  # a chunk with a choice came

    def add(self, chunk: dict[str, Any]) -> str | None:
        """Take a chunk (as parsed JSON); its piece of text, if any."""
        if chunk.get("model"):
            self.model_id = str(chunk["model"])
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = Usage(
                prompt_tokens=int(usage.get("prompt_tokens") or 0),
                completion_tokens=int(usage.get("completion_tokens") or 0),
            )
        choices = chunk.get("choices")
        if not choices:
            return None
        choice = choices[0]
        self.answered = True
        if choice.get("finish_reason"):
            self.finish = str(choice["finish_reason"])
        delta = choice.get("delta") or {}
        for call in delta.get("tool_calls") or ():
            parts = self.calls.setdefault(int(call.get("index", 0)), ["", ""])
            if call.get("id"):
                parts[0] = str(call["id"])
            function = call.get("function") or {}
            if function.get("name"):
                parts[1] += str(function["name"])
            if function.get("arguments"):
                parts.append(str(function["arguments"]))
        content = delta.get("content")
        if not content:
            return None
        self.text.append(str(content))
        return str(content)

    def completion(self) -> Completion:
        if not self.answered:
            raise RetryableToolError("unparsable model response: no choices")
        return Completion(
            content="".join(self.text) if self.text else None,
            tool_calls=tuple(
                ToolCall(call_id=p[0], name=p[1], args_json="".join(p[2:]) or "{}")
                for _, p in sorted(self.calls.items())
            ),
            finish_reason=self.finish,
            usage=self.usage,
            model_id=self.model_id,
        )


def _chunk(data: str) -> dict[str, Any]:
    """One event's JSON; an error sent in the stream is the call's failure."""
    import orjson  # noqa: PLC0415

    try:
        chunk = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise RetryableToolError(f"unparsable model response: {e}") from e
    if not isinstance(chunk, dict):
        raise RetryableToolError("unparsable model response: not an object")
    error = chunk.get("error")
    if error is not None:
        raise Unavailable(f"model error in the stream: {str(error)[:300]}")
    return chunk


def _whole(body: bytes) -> ChatCompletion:
    """A whole (not streamed) answer's body, checked like a streamed one."""
    from openai.types.chat import ChatCompletion  # noqa: PLC0415
    from pydantic import ValidationError  # noqa: PLC0415

    try:
        return ChatCompletion.model_validate_json(body)
    except ValidationError as e:
        raise RetryableToolError(f"unparsable model response: {e}") from e


def _content(response: ChatCompletion) -> str | None:
    return response.choices[0].message.content if response.choices else None
