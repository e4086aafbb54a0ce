"""The SDK adapters against local servers that validate every request with the SDK's
own request types: tools sent, the transcript in each wire shape, usage and the served
model recorded, and each kind of failure mapped to what the runtime does with it."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from es_agents.adapters.anthropic_model import AnthropicModel, to_anthropic
from es_agents.adapters.openai_model import OpenAIChatModel, to_openai_messages
from es_agents.core.events import ToolCall
from es_agents.errors import ModelError, RateLimited, RetryableToolError, Unavailable
from es_agents.models import Completion, ModelClient, call, reply
from es_agents.retry import retrying
from es_agents.tools import ToolContext, tool
from tests.wire_servers import Fault, WireServer, wire_server


class CityArgs(BaseModel):
    city: str


@tool(CityArgs, side_effect=False)
def weather(args: CityArgs, ctx: ToolContext) -> str:
    """The weather in a city."""
    return "sunny"


TOOLS = (weather.schema(),)
PARALLEL = Completion(
    content=None,
    tool_calls=(
        ToolCall(call_id="c1", name="weather", args_json='{"city":"Oslo"}'),
        ToolCall(call_id="c2", name="weather", args_json='{"city":"Rome"}'),
    ),
)
SCRIPT = [call("weather", "c0", city="Paris"), PARALLEL, reply("done")]
TRANSCRIPT: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": '{"ask": "weather"}'},
]


def _after_first_turns() -> list[dict[str, Any]]:
    """The fold's transcript after a single call and two parallel calls."""
    return [
        *TRANSCRIPT,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"call_id": "c0", "name": "weather", "args_json": '{"city":"Paris"}'}
            ],
        },
        {"role": "tool", "tool_call_id": "c0", "name": "weather", "content": '"sunny"'},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [c.model_dump() for c in PARALLEL.tool_calls],
        },
        {"role": "tool", "tool_call_id": "c1", "name": "weather", "content": '"sunny"'},
        {
            "role": "tool",
            "tool_call_id": "c2",
            "name": "weather",
            "content": "error: x",
        },
    ]


@pytest.fixture(params=["openai", "anthropic"])
def served(request: pytest.FixtureRequest) -> Iterator[tuple[WireServer, ModelClient]]:
    with wire_server(request.param, SCRIPT) as server:
        model: ModelClient
        if request.param == "openai":
            model = OpenAIChatModel(server.url, "asked-model", timeout=1.0)
        else:
            model = AnthropicModel("asked-model", base_url=server.url, timeout=1.0)
        yield server, model


def test_a_whole_tool_loop_in_the_wire_shape(
    served: tuple[WireServer, ModelClient],
) -> None:
    server, model = served
    first = model.complete(TRANSCRIPT, {}, TOOLS)
    assert first.tool_calls[0].name == "weather"
    assert json.loads(first.tool_calls[0].args_json) == {"city": "Paris"}
    assert first.model_id == "served-model-1"  # what served it, not what was asked
    assert (first.usage.prompt_tokens, first.usage.completion_tokens) == (11, 7)
    sent = server.requests[0]
    tools = sent["tools"]
    assert [t.get("name") or t["function"]["name"] for t in tools] == ["weather"]
    schema = tools[0].get("input_schema") or tools[0]["function"]["parameters"]
    assert schema["properties"]["city"]["type"] == "string"
    transcript = _after_first_turns()
    second = model.complete(transcript[:4], {}, TOOLS)
    assert [c.call_id for c in second.tool_calls] == ["c1", "c2"]  # parallel calls
    last = model.complete(transcript, {}, TOOLS)
    assert last.content == "done"
    assert not last.tool_calls
    assert server.rejected == []  # every request validated against the SDK types
    assert len(server.requests) == 3


def test_failures_map_to_what_the_runtime_does(
    served: tuple[WireServer, ModelClient],
) -> None:
    server, model = served
    server.fail_next(Fault(429, {"Retry-After": "2"}))
    with pytest.raises(RateLimited) as limited:
        model.complete(TRANSCRIPT, {}, TOOLS)
    assert limited.value.retry_after == 2.0
    server.fail_next(Fault(500))
    with pytest.raises(Unavailable):
        model.complete(TRANSCRIPT, {}, TOOLS)
    server.fail_next(Fault(400))
    with pytest.raises(ModelError, match="HTTP 400"):
        model.complete(TRANSCRIPT, {}, TOOLS)
    server.fail_next(Fault(200, body=b'{"choices": "not a list"'))
    with pytest.raises(RetryableToolError, match="unparsable"):
        model.complete(TRANSCRIPT, {}, TOOLS)
    server.fail_next(Fault(delay=2.0))  # the client's timeout is 1 s
    started = time.monotonic()
    with pytest.raises(Unavailable):
        model.complete(TRANSCRIPT, {}, TOOLS)
    assert time.monotonic() - started < 1.9


def test_a_request_the_api_would_refuse_is_refused(
    served: tuple[WireServer, ModelClient],
) -> None:
    """The servers are strict: the old hand-made tool-call shape does not pass."""
    _, model = served
    bad = [
        *TRANSCRIPT,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"call_id": "c0", "name": "weather"}],  # no args_json
        },
    ]
    with pytest.raises((ModelError, KeyError)):
        model.complete(bad, {}, TOOLS)


def test_the_retry_policy_waits_as_long_as_the_server_asks() -> None:
    calls: list[float] = []

    def flaky() -> str:
        calls.append(time.monotonic())
        if len(calls) < 3:
            raise Unavailable("busy", retry_after=0.3 if len(calls) == 1 else None)
        return "ok"

    for tried in retrying(5, on=(Unavailable,), initial=0.01, maximum=0.05):
        with tried:
            result = flaky()
    assert result == "ok"
    assert len(calls) == 3
    assert calls[1] - calls[0] >= 0.3  # Retry-After honoured
    assert calls[2] - calls[1] < 0.3  # then the short backoff

    def refused() -> None:
        for tried in retrying(5, on=(Unavailable,)):
            with tried:
                calls.append(time.monotonic())
                raise ValueError("no retry")

    with pytest.raises(ValueError, match="no retry"):
        refused()
    assert len(calls) == 4  # one attempt: not a failure to retry


def test_wire_shapes() -> None:
    wire = to_openai_messages(_after_first_turns())
    assert wire[2] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c0",
                "type": "function",
                "function": {"name": "weather", "arguments": '{"city":"Paris"}'},
            }
        ],
    }
    assert wire[3] == {"role": "tool", "tool_call_id": "c0", "content": '"sunny"'}
    system, messages = to_anthropic(_after_first_turns())
    assert system == "Be brief."
    assert messages[-1] == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "c1", "content": '"sunny"'},
            {
                "type": "tool_result",
                "tool_use_id": "c2",
                "content": "error: x",
                "is_error": True,
            },
        ],
    }
    assert [m["role"] for m in messages] == [
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
def test_the_example_agent_takes_its_model_from_the_environment(
    wire: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from es_agents.core.state import RunState  # noqa: PLC0415
    from es_agents.core.step import CallModel  # noqa: PLC0415
    from es_agents.lab import research  # noqa: PLC0415
    from examples import any_model  # noqa: PLC0415

    with wire_server(wire, research.SCRIPT) as server:  # type: ignore[arg-type]
        monkeypatch.setenv("ES_AGENTS_MODEL_PROVIDER", wire)
        monkeypatch.setenv("ES_AGENTS_MODEL_BASE_URL", server.url)
        monkeypatch.setenv("ES_AGENTS_MODEL_NAME", "local-model")
        agent = any_model.agent()
        step = agent.plan(RunState(run_id="r", input_json='{"topic": "x"}'))
        assert isinstance(step, CallModel)
        assert agent.model is not None
        first = agent.model.complete(step.messages, step.params, step.tools)
    assert first.tool_calls[0].name == "search"
    assert server.requests[0]["model"] == "local-model"
    assert server.rejected == []


@pytest.mark.parametrize("wire", ["openai", "anthropic"])
def test_the_async_client_speaks_the_same_wire(wire: str) -> None:
    """``acomplete`` (the SDK's async client, awaited on the worker's event loop):
    the same requests and answers, the same errors."""
    with wire_server(wire, SCRIPT) as server:  # type: ignore[arg-type]
        model: OpenAIChatModel | AnthropicModel
        if wire == "openai":
            model = OpenAIChatModel(server.url, "asked-model", timeout=1.0)
        else:
            model = AnthropicModel("asked-model", base_url=server.url, timeout=1.0)

        async def conversation() -> None:
            first = await model.acomplete(TRANSCRIPT, {}, TOOLS)
            assert first.tool_calls[0].name == "weather"
            assert first.model_id == "served-model-1"
            transcript = _after_first_turns()
            second = await model.acomplete(transcript[:4], {}, TOOLS)
            assert [c.call_id for c in second.tool_calls] == ["c1", "c2"]
            server.fail_next(Fault(429, {"Retry-After": "2"}))
            with pytest.raises(RateLimited) as limited:
                await model.acomplete(transcript, {}, TOOLS)
            assert limited.value.retry_after == 2.0
            server.fail_next(Fault(400))
            with pytest.raises(ModelError, match="HTTP 400"):
                await model.acomplete(transcript, {}, TOOLS)
            last = await model.acomplete(transcript, {}, TOOLS)
            assert last.content == "done"

        asyncio.run(conversation())
        assert server.rejected == []
