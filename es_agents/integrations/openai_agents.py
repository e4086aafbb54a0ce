"""OpenAI Agents SDK agents, durable on the log (the ``openai-agents`` extra).

``durable(agent)`` takes an ``agents.Agent`` -- with its function tools and its
handoffs to other agents -- and returns an es-agents agent that runs it step by
step on the log. Each request to a model and each tool call is a step with every
invariant of es-agents' own agents (written ahead, the idempotency key
``run_id:step``, reconciliation, gates by tool -- the SDK's ``needs_approval``
tools and any named in ``gated`` --, fencing, budgets, the version gate over
every agent's instructions, model and tool schemas).

A handoff is a step too: when the model calls ``transfer_to_<agent>``, the run
records the agent it hands to (``state_patched`` ``agent``) and answers the call;
from then on the model is sent that agent's instructions, tools and handoffs, and
its model is asked. Which agent is active is part of the run's state, so a
resumed run continues with the agent it had.

Only the SDK's public interface is used: ``Agent.get_system_prompt`` and
``Agent.get_all_tools`` when ``durable`` is called, ``Model.get_response`` for a
request, ``FunctionTool.on_invoke_tool`` for a call. A tool's
``ToolContext.tool_call_id`` is the call's idempotency key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from agents import Agent, ModelSettings, RunContextWrapper
from agents.handoffs import Handoff, handoff
from agents.items import TResponseInputItem
from agents.models.interface import Model, ModelTracing
from agents.models.multi_provider import MultiProvider
from agents.tool import FunctionTool
from agents.tool_context import ToolContext as SDKToolContext
from openai import APIConnectionError, APIStatusError
from pydantic import BaseModel, JsonValue

from es_agents.agent import ToolAgent
from es_agents.core.approvals import ApprovalPolicy
from es_agents.core.events import ToolCall, Usage
from es_agents.core.state import RunState
from es_agents.core.step import (
    Message,
    PatchState,
    Respond,
    Step,
    ToolSpec,
    canonical_json,
)
from es_agents.errors import ConfigError, TerminalToolError, Unavailable
from es_agents.integrations.common import json_or_text, run_to_end, user_prompt
from es_agents.models import Completion, status_error
from es_agents.tools import Arguments, SchemaTool, ToolContext

ACTIVE = "agent"  # the state key naming the agent that has the conversation
AGENT_PARAM = "agent"  # the request parameter naming the agent asked


@dataclass(frozen=True)
class SDKTool(SchemaTool):
    """A function tool of the SDK, or a handoff; its schema is the SDK's."""

    hands_to: str | None = None  # a handoff: the agent it hands the run to


@dataclass(frozen=True)
class _Member:
    """One agent of the graph, read once: its instructions and what it offers."""

    name: str
    instructions: str
    tools: tuple[str, ...]  # its tools' and handoffs' names
    model: Model
    settings: ModelSettings


@dataclass
class OpenAIAgentsAgent(ToolAgent):
    """An es-agents agent made from an SDK agent and those it hands off to."""

    members: dict[str, _Member] = field(default_factory=dict)
    first: str = ""

    def active(self, state: RunState) -> _Member:
        name = state.vars.get(ACTIVE)
        return self.members.get(str(name), self.members[self.first])

    def system_for(self, state: RunState) -> str:
        return self.active(state).instructions

    def request_params(self, state: RunState) -> dict[str, JsonValue]:
        return {**self.params, AGENT_PARAM: self.active(state).name}

    def offered(self, state: RunState) -> tuple[ToolSpec, ...]:
        names = set(self.active(state).tools)
        return tuple(t.schema() for t in self.tool_list if t.name in names)

    def plan(self, state: RunState) -> Step:
        handoffs = [
            c
            for c in state.open_tool_calls
            if isinstance(self.tools.get(c.name), SDKTool)
            and cast(SDKTool, self.tools[c.name]).hands_to is not None
        ]
        if handoffs:  # the run hands over: recorded, then the call answered
            first = handoffs[0]
            target = cast(SDKTool, self.tools[first.name]).hands_to
            if state.vars.get(ACTIVE, self.first) != target:
                return PatchState(ACTIVE, target)
            if len(handoffs) > 1:  # as the SDK: the first handoff counts
                return Respond(handoffs[1].call_id, "Multiple handoffs: ignored.")
            return Respond(first.call_id, {"assistant": target})
        return super().plan(state)

    def versions(self) -> dict[str, str | int]:
        versions = super().versions()
        prompts = canonical_json(
            {n: m.instructions for n, m in sorted(self.members.items())}
        )
        versions["prompt_hash"] = (
            "sha256:" + hashlib.sha256(prompts.encode()).hexdigest()
        )
        return versions


def durable(
    agent: Agent[Any],
    *,
    context: Any = None,
    gated: Collection[str] = (),
    approval: Mapping[str, ApprovalPolicy] | None = None,
    read_only: Collection[str] = (),
    honors_idempotency_key: Collection[str] = (),
    version: str = "1",
    **settings: Any,
) -> OpenAIAgentsAgent:
    """An SDK agent (and every agent it can hand off to) as an es-agents agent.

    ``context`` is the run context the SDK passes tools and instructions, the
    same for every run this worker serves. ``gated`` names tools that wait for an
    approval besides those the SDK marks ``needs_approval``; ``approval`` gives a
    tool's deciders. Tools are side effects guarded by the dedupe table unless
    named ``read_only`` or ``honors_idempotency_key``. ``settings`` are
    ``ToolAgent``'s (``budget``, ``conversational`` ...)."""
    wrapper = RunContextWrapper(context=context)
    graph = _graph(agent)
    members: dict[str, _Member] = {}
    found: dict[str, SDKTool] = {}
    policies = dict(approval or {})
    for member in graph:
        prompt = run_to_end(member.get_system_prompt(wrapper)) or ""
        listed = run_to_end(member.get_all_tools(wrapper))
        names: list[str] = []
        for sdk_tool in listed:
            if not isinstance(sdk_tool, FunctionTool):
                raise ConfigError(
                    f"agent {member.name!r}: tool {sdk_tool.name!r} is a "
                    f"{type(sdk_tool).__name__}: only function tools run durably"
                )
            made = _tool(
                sdk_tool,
                context,
                gated=sdk_tool.needs_approval is not False
                or sdk_tool.name in gated
                or sdk_tool.name in policies,
                approval=policies.get(sdk_tool.name),
                read_only=sdk_tool.name in read_only,
                honors_key=sdk_tool.name in honors_idempotency_key,
            )
            _add(found, made, member.name)
            names.append(made.name)
        for target in member.handoffs:
            made = _handoff_tool(target)
            _add(found, made, member.name)
            names.append(made.name)
        members[member.name] = _Member(
            member.name,
            prompt,
            tuple(names),
            _model(member),
            member.model_settings,
        )
    for wanted in (gated, policies, read_only, honors_idempotency_key):
        missing = sorted(set(wanted) - set(found))
        if missing:
            raise ConfigError(
                f"agent {agent.name!r} has no tool {', '.join(missing)}; "
                f"it has: {', '.join(sorted(found))}"
            )
    return OpenAIAgentsAgent(
        name=agent.name,
        system_prompt=members[agent.name].instructions,
        model=OpenAIAgentsModel(members),
        tool_list=list(found.values()),
        params={},
        version=version,
        output_model=_output_model(agent),
        members=members,
        first=agent.name,
        **settings,
    )


class OpenAIAgentsModel:
    """The SDK's models, as one es-agents model client: a request goes to the
    model of the agent that has the conversation (the ``agent`` parameter)."""

    def __init__(self, members: Mapping[str, _Member]) -> None:
        self.members = dict(members)
        self.model_id = ",".join(
            sorted({_model_name(m.model) for m in self.members.values()})
        )

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
        member = self.members.get(str(params.get(AGENT_PARAM)))
        if member is None:
            member = next(iter(self.members.values()))
        system, items = to_items(messages)
        offered: list[Any] = [
            FunctionTool(
                name=str(t["name"]),
                description=str(t.get("description") or ""),
                params_json_schema=cast(dict[str, Any], t["parameters"]),
                on_invoke_tool=_never,
                strict_json_schema=False,
            )
            for t in tools
        ]
        model_id = _model_name(member.model)
        try:
            response = await member.model.get_response(
                system,
                items,
                member.settings,
                offered,
                None,
                [],
                ModelTracing.DISABLED,
                previous_response_id=None,
                conversation_id=None,
                prompt=None,
            )
        except APIStatusError as e:
            raise status_error(model_id, e.status_code, e.body, e.response) from e
        except APIConnectionError as e:
            raise Unavailable(f"model {model_id}: {e}") from e
        return _completion(response, model_id)


def to_items(
    messages: Sequence[Message],
) -> tuple[str | None, list[TResponseInputItem]]:
    """es-agents' messages as the SDK's input items (Responses format), and the
    system prompt apart."""
    system: str | None = None
    items: list[dict[str, Any]] = []
    for message in messages:
        role, content = message.get("role"), message.get("content")
        if role == "system":
            system = str(content or "")
        elif role == "user":
            items.append({"role": "user", "content": user_prompt(content)})
        elif role == "assistant":
            if content:
                items.append({"role": "assistant", "content": str(content)})
            for raw in cast(list[dict[str, Any]], message.get("tool_calls") or []):
                call = ToolCall.model_validate(raw)
                items.append(
                    {
                        "type": "function_call",
                        "call_id": call.call_id,
                        "name": call.name,
                        "arguments": call.args_json,
                    }
                )
        elif role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": str(message.get("tool_call_id")),
                    "output": str(content or ""),
                }
            )
    return system, cast(list[TResponseInputItem], items)


def _completion(response: Any, model_id: str) -> Completion:
    texts: list[str] = []
    calls: list[ToolCall] = []
    for item in response.output:
        kind = getattr(item, "type", None)
        if kind == "message":
            for part in getattr(item, "content", []):
                text = getattr(part, "text", None)
                if isinstance(text, str):
                    texts.append(text)
        elif kind == "function_call":
            args = json_or_text(item.arguments or "{}")
            calls.append(
                ToolCall(
                    call_id=item.call_id,
                    name=item.name,
                    args_json=canonical_json(args if isinstance(args, dict) else {}),
                )
            )
    usage = response.usage
    return Completion(
        content="".join(texts) if texts else None,
        tool_calls=tuple(calls),
        finish_reason="tool_calls" if calls else "stop",
        usage=Usage(
            prompt_tokens=int(usage.input_tokens),
            completion_tokens=int(usage.output_tokens),
        ),
        model_id=model_id,
    )


async def _never(ctx: Any, args: str) -> Any:
    raise TerminalToolError("offered to the model only; es-agents calls the tool")


def _tool(
    sdk_tool: FunctionTool,
    context: Any,
    *,
    gated: bool,
    approval: ApprovalPolicy | None,
    read_only: bool,
    honors_key: bool,
) -> SDKTool:
    name = sdk_tool.name

    async def call(args: Arguments, ctx: ToolContext) -> JsonValue:
        arguments = canonical_json(args.model_dump())
        tool_ctx = SDKToolContext(
            context=context,
            tool_name=name,
            tool_call_id=ctx.idempotency_key,
            tool_arguments=arguments,
        )
        value = await sdk_tool.on_invoke_tool(tool_ctx, arguments)
        if isinstance(value, BaseModel):
            value = value.model_dump(mode="json")
        return cast(JsonValue, json_or_text(canonical_json(value)))

    return SDKTool(
        name=name,
        fn=call,
        args_model=Arguments,
        description=sdk_tool.description,
        side_effect=not read_only,
        honors_idempotency_key=honors_key,
        requires_approval=gated,
        approval=approval,
        parameters=dict(sdk_tool.params_json_schema),
    )


def _handoff_tool(target: Agent[Any] | Handoff[Any, Any]) -> SDKTool:
    if isinstance(target, Handoff):
        raise ConfigError(
            f"handoff {target.tool_name!r}: pass the agent itself in handoffs= "
            "(a Handoff object's callbacks do not run durably)"
        )
    made = handoff(target)

    async def unreachable(args: Arguments, ctx: ToolContext) -> JsonValue:
        raise TerminalToolError(f"{made.tool_name} is answered by the run, never run")

    return SDKTool(
        name=made.tool_name,
        fn=unreachable,
        args_model=Arguments,
        description=made.tool_description,
        side_effect=False,
        parameters=dict(made.input_json_schema),
        hands_to=target.name,
    )


def _add(found: dict[str, SDKTool], tool: SDKTool, owner: str) -> None:
    seen = found.get(tool.name)
    if seen is not None and seen.schema() != tool.schema():
        raise ConfigError(
            f"agent {owner!r}: two different tools are named {tool.name!r}"
        )
    found.setdefault(tool.name, tool)


def _graph(agent: Agent[Any]) -> list[Agent[Any]]:
    """The agent and every agent it can reach by handoffs (by name, once)."""
    seen: dict[str, Agent[Any]] = {}
    todo: list[Agent[Any]] = [agent]
    while todo:
        member = todo.pop(0)
        if member.name in seen:
            if seen[member.name] is not member:
                raise ConfigError(f"two agents are named {member.name!r}")
            continue
        seen[member.name] = member
        todo.extend(h for h in member.handoffs if isinstance(h, Agent))
    return list(seen.values())


def _model(agent: Agent[Any]) -> Model:
    model = agent.model
    if isinstance(model, Model):
        return model
    return MultiProvider().get_model(model)


def _model_name(model: Model) -> str:
    return str(getattr(model, "model", None) or type(model).__name__)


def _output_model(agent: Agent[Any]) -> type[BaseModel] | None:
    output = agent.output_type
    if output is None or output is str:
        return None
    if isinstance(output, type) and issubclass(output, BaseModel):
        return output
    raise ConfigError(
        f"agent {agent.name!r}: output_type {output!r} is not supported; use str "
        "or a pydantic model"
    )
