"""The Messages API through the official ``anthropic`` SDK.

The run's neutral transcript becomes Anthropic's shape: system messages go to the
``system`` parameter; assistant tool calls become ``tool_use`` blocks; consecutive
tool results become one user message of ``tool_result`` blocks (with ``is_error`` for
a failed call). Tools are sent with their JSON Schema as ``input_schema``. The SDK's
own retries are off: the runtime's retry policy decides. Streaming is off.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, final

from pydantic import JsonValue

from es_agents.core.events import ToolCall, Usage
from es_agents.core.step import Message, ToolSpec, canonical_json
from es_agents.models import Completion, parsed, sdk_errors

if TYPE_CHECKING:
    from anthropic import Anthropic, AsyncAnthropic
    from anthropic.types import Message as AnthropicMessage
    from anthropic.types import MessageParam, ToolParam

ERROR_PREFIX = "error: "  # how the fold marks a failed tool call's content


def to_anthropic(
    messages: Sequence[Message],
) -> tuple[str | None, list[MessageParam]]:
    """(system prompt, messages) in the Messages API's wire shape."""
    system: list[str] = []
    out: list[Any] = []
    results: list[dict[str, Any]] = []

    def close_results() -> None:
        if results:
            out.append({"role": "user", "content": list(results)})
            results.clear()

    for m in messages:
        role = m.get("role")
        content = m.get("content")
        if role == "tool":
            text = str(content or "")
            block: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": str(m.get("tool_call_id")),
                "content": text,
            }
            if text.startswith(ERROR_PREFIX):
                block["is_error"] = True
            results.append(block)
            continue
        close_results()
        if role == "system":
            system.append(str(content or ""))
        elif role == "assistant":
            blocks: list[dict[str, Any]] = []
            if content:
                blocks.append({"type": "text", "text": str(content)})
            calls = m.get("tool_calls")
            for c in calls if isinstance(calls, list) else []:
                if isinstance(c, dict):
                    blocks.append(
                        {
                            "type": "tool_use",
                            "id": c["call_id"],
                            "name": c["name"],
                            "input": _object(str(c["args_json"])),
                        }
                    )
            out.append({"role": "assistant", "content": blocks})
        else:
            out.append({"role": "user", "content": str(content or "")})
    close_results()
    return ("\n\n".join(system) if system else None), out


def to_anthropic_tools(tools: Sequence[ToolSpec]) -> list[ToolParam]:
    return [
        {
            "name": str(t["name"]),
            "description": str(t.get("description") or ""),
            "input_schema": t.get("parameters") or {"type": "object"},  # type: ignore[typeddict-item]
        }
        for t in tools
    ]


def from_anthropic(response: AnthropicMessage, requested_model: str) -> Completion:
    texts: list[str] = []
    calls: list[ToolCall] = []
    for block in response.content:
        if block.type == "text":
            texts.append(block.text)
        elif block.type == "tool_use":
            calls.append(
                ToolCall(
                    call_id=block.id,
                    name=block.name,
                    args_json=canonical_json(block.input),
                )
            )
    return Completion(
        content="".join(texts) if texts else None,
        tool_calls=tuple(calls),
        finish_reason=response.stop_reason or "stop",
        usage=Usage(
            prompt_tokens=response.usage.input_tokens,
            completion_tokens=response.usage.output_tokens,
        ),
        model_id=response.model or requested_model,
    )


@final
class AnthropicModel:
    """``complete`` raises ``Unavailable`` (connection, timeout, 408/409/429/5xx,
    overloaded), ``ModelError`` (another 4xx), ``RetryableToolError`` (a body that
    does not parse). ``acomplete`` is the same on the SDK's async client."""

    def __init__(
        self,
        model: str,
        api_key: str | None = None,
        base_url: str | None = None,
        timeout: float = 120.0,
        max_tokens: int = 4096,
    ) -> None:
        from anthropic import Anthropic  # noqa: PLC0415 - loads only when used

        self.model_id = model
        self.max_tokens = max_tokens
        self._options: dict[str, Any] = {
            "api_key": api_key or "not-needed",
            "base_url": base_url,
            "timeout": timeout,
            "max_retries": 0,
        }
        self._client: Anthropic = Anthropic(**self._options)
        self._async: AsyncAnthropic | None = None  # made on the loop that awaits it

    def _request(
        self,
        messages: Sequence[Message],
        params: dict[str, JsonValue],
        tools: Sequence[ToolSpec],
    ) -> dict[str, Any]:
        system, wire = to_anthropic(messages)
        return {
            "model": self.model_id,
            "messages": wire,
            "stream": False,
            "max_tokens": self.max_tokens,
            **({"system": system} if system is not None else {}),
            **({"tools": to_anthropic_tools(tools)} if tools else {}),
            **params,
        }

    def complete(
        self,
        messages: Sequence[Message],
        params: dict[str, JsonValue],
        tools: Sequence[ToolSpec] = (),
    ) -> Completion:
        with self._translated():
            response: AnthropicMessage = self._client.messages.create(
                **self._request(messages, params, tools)
            )
        return self._parse(response)

    def _aclient(self) -> AsyncAnthropic:
        if self._async is None:
            from anthropic import AsyncAnthropic  # noqa: PLC0415

            self._async = AsyncAnthropic(**self._options)
        return self._async

    async def acomplete(
        self,
        messages: Sequence[Message],
        params: dict[str, JsonValue],
        tools: Sequence[ToolSpec] = (),
    ) -> Completion:
        client = self._aclient()
        with self._translated():
            response: AnthropicMessage = await client.messages.create(
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
        """``acomplete``, streamed (the SDK's ``messages.stream``): ``on_text`` gets
        each piece of text as it comes; the completion is the final message."""
        client = self._aclient()
        request = self._request(messages, params, tools)
        del request["stream"]
        with self._translated():
            async with client.messages.stream(**request) as stream:
                async for text in stream.text_stream:
                    on_text(text)
                response = await stream.get_final_message()
        return self._parse(response)

    @contextlib.contextmanager
    def _translated(self) -> Iterator[None]:
        import anthropic  # noqa: PLC0415 - the SDK loads only when used

        with sdk_errors(anthropic, self.model_id):
            yield

    def _parse(self, response: AnthropicMessage) -> Completion:
        return parsed(from_anthropic, response, self.model_id)


def _object(args_json: str) -> dict[str, object]:
    try:
        value = json.loads(args_json)
    except ValueError:
        return {"_unparsable": args_json}
    return value if isinstance(value, dict) else {"_value": value}
