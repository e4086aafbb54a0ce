"""Pydantic AI agents, durable on the log (the ``pydantic-ai`` extra).

``durable(agent)`` takes an existing ``pydantic_ai.Agent`` and returns an es-agents
agent that runs it step by step on the log: each request to the agent's model and
each call of one of its tools is a step with every invariant of es-agents' own
agents -- written ahead, the idempotency key ``run_id:step``, reconciliation (the
dedupe table, or a tool that honors the key), gates by tool (Pydantic AI's
``requires_approval`` tools, and any named in ``gated``), fencing tokens, budgets,
threads, and the version gate over the prompt, the model and the tool schemas.

Only Pydantic AI's public interface is used. What the agent would send its model
is read by running it once against a ``FunctionModel`` (its system prompts, its
instructions, its tools' definitions and its model settings), when ``durable`` is
called; a request is made with ``pydantic_ai.direct.model_request``; a tool is
called through its toolset (``get_tools`` / ``call_tool``) with a ``RunContext``
whose ``metadata`` holds the call's ``idempotency_key`` and ``fencing_token``.

The loop between model and tools is es-agents' (``ToolAgent``), not Pydantic AI's
graph: see "What is not carried over" in the README.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from pydantic import BaseModel, JsonValue
from pydantic_ai import Agent, ModelRetry
from pydantic_ai.direct import model_request
from pydantic_ai.exceptions import (
    ModelAPIError,
    ModelHTTPError,
    ToolFailed,
    UnexpectedModelBehavior,
)
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import Model, ModelRequestParameters, infer_model
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.settings import ModelSettings
from pydantic_ai.tools import RunContext, ToolDefinition
from pydantic_ai.toolsets import AbstractToolset
from pydantic_ai.usage import RunUsage
from pydantic_core import ValidationError

from es_agents.agent import ToolAgent
from es_agents.core.approvals import ApprovalPolicy
from es_agents.core.events import ToolCall, Usage
from es_agents.core.step import Message, ToolSpec, canonical_json
from es_agents.errors import (
    ConfigError,
    RetryableToolError,
    TerminalToolError,
    Unavailable,
)
from es_agents.integrations.common import json_or_text, run_to_end, user_prompt
from es_agents.models import Completion, status_error
from es_agents.tools import Arguments, SchemaTool, Tool, ToolContext
from es_agents.typed import problems

RETRY = "retry: "  # a tool's ModelRetry, as the model reads it again


@dataclass
class PydanticAIAgent(ToolAgent):
    """An es-agents agent made from a Pydantic AI agent (``durable``)."""

    instructions: str = ""
    source: Any = None  # the pydantic_ai.Agent

    def versions(self) -> dict[str, str | int]:
        versions = super().versions()
        both = canonical_json(
            {"system": self.system_prompt, "instructions": self.instructions}
        )
        versions["prompt_hash"] = "sha256:" + hashlib.sha256(both.encode()).hexdigest()
        return versions


def durable(
    agent: Agent[Any, Any],
    *,
    name: str | None = None,
    model: Model | str | None = None,
    deps: Any = None,
    gated: Collection[str] = (),
    approval: Mapping[str, ApprovalPolicy] | None = None,
    read_only: Collection[str] = (),
    honors_idempotency_key: Collection[str] = (),
    extra_tools: Sequence[Tool[Any]] = (),
    version: str = "1",
    **settings: Any,
) -> PydanticAIAgent:
    """A Pydantic AI agent as an es-agents agent (see the module's docstring).

    ``deps`` is the agent's dependencies for every run this worker serves (a
    callable is called once, here). ``gated`` names tools that wait for an
    approval besides those Pydantic AI marks ``requires_approval``; ``approval``
    gives a tool's deciders. Tools are side effects guarded by the dedupe table
    unless named ``read_only`` or ``honors_idempotency_key``. ``extra_tools`` adds
    es-agents tools (an MCP server's, say). ``settings`` are ``ToolAgent``'s
    (``budget``, ``conversational``, ``version_policy``, ``encrypted`` ...)."""
    run_name = name or agent.name
    if not run_name:
        raise ConfigError("durable(agent): the agent has no name; pass name=")
    chosen = model if model is not None else agent.model
    if chosen is None:
        raise ConfigError(f"agent {run_name!r} has no model; pass model=")
    the_model = infer_model(chosen) if isinstance(chosen, str) else chosen
    if callable(deps):
        deps = deps()
    head = run_to_end(_capture(agent, the_model, deps))
    found = run_to_end(_tools(agent, the_model, deps))
    output = _output_model(agent, run_name)
    names = {t.name for t, _ in found} | {t.name for t in extra_tools}
    for wanted in (gated, approval or {}, read_only, honors_idempotency_key):
        missing = sorted(set(wanted) - names)
        if missing:
            raise ConfigError(
                f"agent {run_name!r} has no tool {', '.join(missing)}; "
                f"it has: {', '.join(sorted(names))}"
            )
    policies = dict(approval or {})
    tools: list[Tool[Any]] = [
        _tool(
            definition,
            toolset,
            the_model,
            deps,
            gated=definition.kind == "unapproved"
            or definition.name in gated
            or definition.name in policies,
            approval=policies.get(definition.name),
            read_only=definition.name in read_only,
            honors_key=definition.name in honors_idempotency_key,
        )
        for definition, toolset in found
    ]
    return PydanticAIAgent(
        name=run_name,
        system_prompt=head.system,
        model=PydanticAIModel(
            the_model, settings=head.settings, instructions=head.instructions
        ),
        tool_list=[*tools, *extra_tools],
        version=version,
        output_model=output,
        instructions=head.instructions or "",
        source=agent,
        **settings,
    )


class PydanticAIModel:
    """Any model Pydantic AI speaks to, as an es-agents model client: es-agents'
    messages become Pydantic AI's, and its answer a ``Completion``."""

    def __init__(
        self,
        model: Model,
        *,
        settings: ModelSettings | None = None,
        instructions: str | None = None,
    ) -> None:
        self.model = model
        self.settings = settings
        self.instructions = instructions
        self.model_id = f"{model.system}:{model.model_name}"

    def complete(
        self,
        messages: Sequence[Message],
        params: dict[str, JsonValue],
        tools: Sequence[ToolSpec] = (),
    ) -> Completion:
        return run_to_end(self.acomplete(messages, params, tools))

    async def acomplete(
        self,
        messages: Sequence[Message],
        params: dict[str, JsonValue],
        tools: Sequence[ToolSpec] = (),
    ) -> Completion:
        asked = ModelRequestParameters(
            function_tools=[
                ToolDefinition(
                    name=str(t["name"]),
                    description=str(t.get("description") or ""),
                    parameters_json_schema=cast(dict[str, Any], t["parameters"]),
                )
                for t in tools
            ],
            allow_text_output=True,
        )
        history = to_pydantic_ai(messages, self.instructions)
        try:
            response = await model_request(
                self.model,
                history,
                model_settings=self.settings,
                model_request_parameters=asked,
            )
        except ModelHTTPError as e:
            headers = type("Answer", (), {"headers": e.headers or {}})()
            raise status_error(self.model_id, e.status_code, e.body, headers) from e
        except UnexpectedModelBehavior as e:
            raise RetryableToolError(f"unparsable model response: {e}") from e
        except ModelAPIError as e:  # no answer: a connection, a timeout
            raise Unavailable(f"model {self.model_id}: {e}") from e
        return from_pydantic_ai(response, self.model_id)


def to_pydantic_ai(
    messages: Sequence[Message], instructions: str | None = None
) -> list[ModelMessage]:
    """es-agents' messages (system, user, assistant with tool calls, tool results)
    as Pydantic AI's: requests of parts, and responses."""
    out: list[ModelMessage] = []
    parts: list[ModelRequestPart] = []
    names: dict[str, str] = {}

    def flush() -> None:
        if parts:
            out.append(ModelRequest(parts=list(parts), instructions=instructions))
            parts.clear()

    for message in messages:
        role, content = message.get("role"), message.get("content")
        if role == "system":
            if content:
                parts.append(SystemPromptPart(content=str(content)))
        elif role == "user":
            parts.append(UserPromptPart(content=user_prompt(content)))
        elif role == "tool":
            call_id = str(message.get("tool_call_id"))
            tool = str(message.get("name") or names.get(call_id, ""))
            text = str(content or "")
            failed = text.startswith("error: ")
            said = text.removeprefix("error: ")
            retried = failed and said.startswith(RETRY)
            parts.append(
                ToolReturnPart(
                    tool_name=tool,
                    content=said.removeprefix(RETRY) if failed else json_or_text(text),
                    tool_call_id=call_id,
                    outcome="retried" if retried else "failed" if failed else "success",
                )
            )
        elif role == "assistant":
            flush()
            answer: list[TextPart | ToolCallPart] = []
            if content:
                answer.append(TextPart(content=str(content)))
            for raw in cast(list[dict[str, Any]], message.get("tool_calls") or []):
                call = ToolCall.model_validate(raw)
                names[call.call_id] = call.name
                answer.append(
                    ToolCallPart(
                        tool_name=call.name,
                        args=call.args_json,
                        tool_call_id=call.call_id,
                    )
                )
            out.append(ModelResponse(parts=answer))
    flush()
    return out


def from_pydantic_ai(response: ModelResponse, model_id: str) -> Completion:
    """A Pydantic AI answer as a ``Completion`` (its text, its tool calls)."""
    calls = tuple(
        ToolCall(
            call_id=part.tool_call_id,
            name=part.tool_name,
            args_json=canonical_json(part.args_as_dict()),
        )
        for part in response.tool_calls
    )
    usage = response.usage
    return Completion(
        content=response.text,
        tool_calls=calls,
        finish_reason="tool_calls" if calls else "stop",
        usage=Usage(
            prompt_tokens=usage.input_tokens, completion_tokens=usage.output_tokens
        ),
        model_id=response.model_name or model_id,
    )


def _tool(
    definition: ToolDefinition,
    toolset: AbstractToolset[Any],
    model: Model,
    deps: Any,
    *,
    gated: bool,
    approval: ApprovalPolicy | None,
    read_only: bool,
    honors_key: bool,
) -> SchemaTool:
    name = definition.name

    async def call(args: Arguments, ctx: ToolContext) -> JsonValue:
        run_ctx = RunContext[Any](
            deps=deps,
            model=model,
            usage=RunUsage(),
            tool_name=name,
            run_id=ctx.run_id,
            run_step=ctx.step,
            retry=ctx.attempt - 1,
            metadata={
                "idempotency_key": ctx.idempotency_key,
                "fencing_token": ctx.fencing_token,
            },
        )
        try:
            async with toolset:
                tool = (await toolset.get_tools(run_ctx))[name]
                try:
                    checked = tool.args_validator.validate_python(args.model_dump())
                except ValidationError as e:  # the model is told, and tries again
                    why = problems(e, "arguments")
                    raise TerminalToolError(
                        f"{RETRY}{name}: invalid arguments: {why}"
                    ) from e
                value = await toolset.call_tool(name, checked, run_ctx, tool)
        except ModelRetry as e:  # the model is asked to try again, told why
            raise TerminalToolError(f"{RETRY}{e.message}") from e
        except ToolFailed as e:
            raise TerminalToolError(str(e)) from e
        return cast(JsonValue, json.loads(canonical_json(_plain(value))))

    return SchemaTool(
        name=name,
        fn=call,
        args_model=Arguments,
        description=definition.description or "",
        side_effect=not read_only,
        honors_idempotency_key=honors_key,
        requires_approval=gated,
        approval=approval,
        parameters=dict(definition.parameters_json_schema),
    )


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return value


@dataclass(frozen=True)
class _Head:
    system: str
    instructions: str | None
    settings: ModelSettings | None


class _Captured(Exception):
    def __init__(self, messages: list[ModelMessage], info: AgentInfo) -> None:
        super().__init__("captured")
        self.messages, self.info = messages, info


async def _capture(agent: Agent[Any, Any], model: Model, deps: Any) -> _Head:
    """What the agent sends its model first: read by running it against a
    ``FunctionModel`` that stops at the first request."""

    def stop(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        raise _Captured(messages, info)

    try:
        await agent.run("", model=FunctionModel(stop), deps=deps)
    except _Captured as e:
        first = e.messages[0]
        system = [
            p.content
            for p in getattr(first, "parts", [])
            if isinstance(p, SystemPromptPart)
        ]
        instructions = getattr(first, "instructions", None)
        settings = e.info.model_settings or getattr(agent, "model_settings", None)
        return _Head("\n\n".join(system), instructions, settings)
    raise ConfigError("the agent answered without asking its model")


async def _tools(
    agent: Agent[Any, Any], model: Model, deps: Any
) -> list[tuple[ToolDefinition, AbstractToolset[Any]]]:
    """Every tool of the agent's toolsets, with its definition."""
    ctx = RunContext[Any](deps=deps, model=model, usage=RunUsage())
    found: list[tuple[ToolDefinition, AbstractToolset[Any]]] = []
    for toolset in agent.toolsets:
        async with toolset:
            listed = await toolset.get_tools(ctx)
        for tool in listed.values():
            if tool.tool_def.kind not in ("function", "unapproved"):
                raise ConfigError(
                    f"tool {tool.tool_def.name!r} is of kind {tool.tool_def.kind!r}: "
                    "only function tools (approved or not) run durably"
                )
            found.append((tool.tool_def, toolset))
    return found


def _output_model(agent: Agent[Any, Any], name: str) -> type[BaseModel] | None:
    output = agent.output_type
    if output is str:
        return None
    if isinstance(output, type) and issubclass(output, BaseModel):
        return output
    raise ConfigError(
        f"agent {name!r}: output_type {output!r} is not supported; use str or a "
        "pydantic model"
    )


__all__ = [
    "PydanticAIAgent",
    "PydanticAIModel",
    "durable",
    "from_pydantic_ai",
    "to_pydantic_ai",
]
