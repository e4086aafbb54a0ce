"""Agents: a planner over the folded state, plus the tools and model it uses.

``ToolAgent`` is the built-in tool-calling agent: the model is the planner
(messages -> completion -> tool calls -> results -> model), configured with a system
prompt and tools. Any object with ``plan``, ``tools``, ``model`` and ``versions`` is an
agent; a custom planner may also patch state, sleep, ask for input or fail.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from importlib import import_module
from typing import Any, Protocol

from pydantic import BaseModel, JsonValue, ValidationError

from es_agents import typed
from es_agents.core.approvals import ApprovalPolicy
from es_agents.core.budget import Budget
from es_agents.core.events import ToolCall
from es_agents.core.flow import Limits
from es_agents.core.retention import Retention
from es_agents.core.state import (
    AWAITING_CHILDREN,
    AWAITING_MESSAGE,
    CHILD_LOOKUP_AFTER,
    RunState,
    Versions,
)
from es_agents.core.step import (
    CallModel,
    CallTool,
    CallTools,
    Decline,
    Fail,
    Finish,
    Interrupt,
    Message,
    Respond,
    Step,
    ToolSpec,
    args_hash,
)
from es_agents.core.transcript import Conversation
from es_agents.core.versions import StateMigration, VersionPolicy
from es_agents.errors import ConfigError
from es_agents.models import ModelClient
from es_agents.tools import Tool, tools_hash


class Agent(Protocol):
    name: str

    @property
    def tools(self) -> Mapping[str, Tool[Any]]: ...

    @property
    def model(self) -> ModelClient | None: ...

    def plan(self, state: RunState) -> Step: ...

    def versions(self) -> dict[str, str | int]: ...


@dataclass
class ToolAgent:
    name: str
    system_prompt: str
    model: ModelClient | None
    tool_list: list[Tool[Any]] = field(default_factory=list)
    params: dict[str, JsonValue] = field(default_factory=dict)
    version: str = "1"
    version_policy: VersionPolicy = field(default_factory=VersionPolicy)
    migrations: list[StateMigration] = field(default_factory=list)
    # Payloads written encrypted under a per-run data key (es_agents.vault).
    encrypted: bool = False
    # How far one run may go: model calls, tokens, steps, seconds, turns
    # (core.budget).
    budget: Budget = field(default_factory=Budget)
    # How many of its runs take steps at once, in all and per tenant; the others
    # wait in a queue for a place (core.flow).
    limits: Limits = field(default_factory=Limits)
    # How long its finished runs stay projected before they are archived to the
    # object store and their rows purged (core.retention; default: for ever).
    retention: Retention = field(default_factory=Retention)
    # A thread: after a reply the run waits for the next message (send_message)
    # instead of completing; the next turn continues the same transcript.
    conversational: bool = False
    # Stream the model's answers to watchers while the call is in flight, when the
    # model client can (``astream``); what is durable is the same either way.
    stream: bool = True
    # Typed runs (es_agents.typed): the input checked at the start, the final
    # answer one JSON object that fits the output model (the run's output).
    input_model: type[BaseModel] | None = None
    output_model: type[BaseModel] | None = None
    # While it waits for child runs (``subagent`` tools): how long before it looks
    # them up in the log itself, should a child's worker die before telling it.
    children_lookup: timedelta = CHILD_LOOKUP_AFTER

    def __post_init__(self) -> None:
        if self.conversational and self.output_model is not None:
            raise ConfigError(
                f"agent {self.name!r}: a conversational agent has no single output "
                "(output_model is for agents whose run ends with an answer)"
            )

    def check_input(self, input_json: str) -> str | None:
        """Why a run may not start with this input (None: it may)."""
        if self.input_model is None:
            return None
        return typed.input_problem(self.input_model, input_json)

    @property
    def tools(self) -> Mapping[str, Tool[Any]]:
        return {t.name: t for t in self.tool_list}

    @property
    def gates(self) -> frozenset[str]:
        """The approval gates this agent can stop at: its tools that need approval."""
        return frozenset(t.name for t in self.tool_list if t.requires_approval)

    @property
    def approval_policies(self) -> dict[str, ApprovalPolicy]:
        """Who decides each gate, for the tools that say (``approval=``)."""
        return {t.name: t.approval for t in self.tool_list if t.approval is not None}

    @property
    def escalations(self) -> dict[str, tuple[ApprovalPolicy, timedelta]]:
        """Who decides each gate once its deadline passed, and for how long."""
        return {
            t.name: (t.escalate_to, t.decide_within)
            for t in self.tool_list
            if t.escalate_to is not None and t.decide_within is not None
        }

    def _gated(self, name: str) -> bool:
        tool = self.tools.get(name)
        return tool is not None and (tool.requires_approval or tool.asks_human)

    def versions(self) -> dict[str, str | int]:
        return {
            "agent_version": f"{self.name}@{self.version}",
            "prompt_hash": "sha256:"
            + hashlib.sha256(self.system_prompt.encode()).hexdigest(),
            "model_id": self.model.model_id if self.model is not None else "",
            "tools_hash": typed.io_hash(
                tools_hash(self.tool_list), self.input_model, self.output_model
            ),
        }

    def offered(self, state: RunState) -> tuple[ToolSpec, ...]:
        """The tools the model is offered at this point of the run (all of them;
        an agent with handoffs offers the active agent's)."""
        return tuple(t.schema() for t in self.tool_list)

    def request_params(self, state: RunState) -> dict[str, JsonValue]:
        """The request's parameters at this point of the run."""
        return dict(self.params)

    def system_for(self, state: RunState) -> str:
        """The system prompt at this point of the run."""
        return self.system_prompt

    def messages(self, state: RunState) -> Conversation:
        """The system prompt and the run's input, then its transcript (read from
        its stored chunks only when the model is sent it)."""
        system = self.system_for(state)
        if self.output_model is not None:
            system += "\n\n" + typed.output_instruction(self.output_model)
        head: list[Message] = [
            {"role": "system", "content": system},
            {"role": "user", "content": state.input_json},
        ]
        return Conversation(head, state.transcript)

    def _typed_finish(self, state: RunState, last: Message) -> Step:
        """The final answer as the output model, or the model asked again."""
        model = self.output_model
        assert model is not None  # noqa: S101 - checked by the caller
        value, why = typed.parse_output(model, last.get("content"))
        if value is not None:
            return Finish(value.model_dump(mode="json"))
        if _invalid_in_a_row(state, model) >= typed.OUTPUT_TRIES:
            return Fail(
                f"the answer does not fit {model.__name__} after "
                f"{typed.OUTPUT_TRIES} tries: {why}",
                kind=typed.OUTPUT_INVALID,
            )
        again: Message = {"role": "user", "content": typed.correction(model, why or "")}
        conversation = self.messages(state)
        return CallModel(
            Conversation(conversation.head, conversation.transcript, [again]),
            self.request_params(state),
            self.offered(state),
        )

    def _calls(self, state: RunState) -> Step:  # noqa: PLR0911 - one per outcome
        """The step for the calls the model asked for: the calls without a gate
        run at once, concurrently; a gated call waits for its decision (or a
        person's answer) without holding them."""
        running = state.children  # calls whose child run is started: waited for
        calls = [c for c in state.open_tool_calls if c.call_id not in running]
        free = [_call_tool(c) for c in calls if not self._gated(c.name)]
        if len(free) > 1:
            return CallTools(tuple(free))
        if free:
            return free[0]
        if not calls:
            return _await_children(state, self.children_lookup)
        call = calls[0]
        tool = self.tools.get(call.name)
        if tool is not None and tool.asks_human:
            return _ask_human(state, call, tool)
        if tool is not None and tool.requires_approval:
            decided = state.gate_decisions.get(tool.name) or {}
            seq = decided.get("seq")
            if not isinstance(seq, int) or seq < state.last_outcome_seq:
                return _ask_approval(tool.name, call, _deadline(state, tool))
            if decided.get("reason") != "approved":
                if tool.on_reject == "tell_model":
                    return Decline(call.call_id, _rejection(decided))
                return Finish({"rejected": call.name, "by": decided.get("by")})
            approved = decided.get("args_hash")
            if isinstance(approved, str) and approved != args_hash(call.args_json):
                return _ask_approval(  # the approval was for other arguments
                    tool.name,
                    call,
                    _deadline(state, tool),
                    void="the arguments changed after the approval",
                )
        return _call_tool(call)

    def plan(self, state: RunState) -> Step:
        if state.open_tool_calls:
            return self._calls(state)
        last = state.transcript[-1] if state.transcript else None
        if last is not None and last.get("role") == "assistant":
            if self.output_model is not None:
                return self._typed_finish(state, last)
            if not self.conversational:
                return Finish({"answer": last.get("content")})
            turns = self.budget.max_turns
            if turns is not None and state.turns >= turns:
                return Finish(
                    {
                        "answer": last.get("content"),
                        "turns": state.turns,
                        "ended": "turns",
                    }
                )
            return Interrupt(reason=AWAITING_MESSAGE, detail={"turn": state.turns})
        return CallModel(
            self.messages(state),
            self.request_params(state),
            self.offered(state),
        )


def _await_children(state: RunState, lookup: timedelta) -> Interrupt:
    """A pause until the children end (each end resumes the run with its output);
    its timer looks them up in the log should a child's worker die before telling."""
    wake = state.updated_at + lookup if state.updated_at is not None else None
    return Interrupt(
        reason=AWAITING_CHILDREN,
        detail={"children": dict(state.children)},
        wake_at=wake,
    )


def _invalid_in_a_row(state: RunState, model: type[BaseModel]) -> int:
    """How many of the run's last answers in a row did not fit ``model``."""
    count = 0
    transcript = state.transcript
    for i in range(len(transcript) - 1, -1, -1):
        message = transcript[i]
        if message.get("role") != "assistant" or message.get("tool_calls"):
            break
        if typed.parse_output(model, message.get("content"))[0] is not None:
            break
        count += 1
    return count


def _ask_human(state: RunState, call: ToolCall, tool: Tool[Any]) -> Step:
    """The person's answer as the call's result, once it came and fits the answer
    model; else a pause for it (again, saying why, when the last one did not fit)."""
    detail: dict[str, JsonValue] = {
        "call_id": call.call_id,
        "tool": call.name,
        "question": _question(call.args_json),
    }
    if tool.answer_model is not None:
        detail["answer_schema"] = tool.answer_model.model_json_schema()
    given = state.last_resume
    if (
        given is None
        or given.reason != "input"
        or given.input_json is None
        or given.seq < state.last_outcome_seq
    ):
        return Interrupt(reason="awaiting_input", detail=detail)
    try:
        answer: JsonValue = json.loads(given.input_json)
    except ValueError:
        answer = given.input_json
    if tool.answer_model is not None:
        try:
            tool.answer_model.model_validate(answer)
        except ValidationError as e:
            why = typed.problems(e, "answer")
            detail["invalid"] = f"the last answer does not fit: {why}"
            return Interrupt(reason="awaiting_input", detail=detail)
    return Respond(call.call_id, answer)


def _question(args_json: str) -> str:
    try:
        args = json.loads(args_json)
    except ValueError:
        return args_json
    question = args.get("question") if isinstance(args, dict) else None
    return str(question) if question is not None else args_json


def _rejection(decided: dict[str, JsonValue]) -> str:
    """What the model reads of a rejected call: who rejected it, and why."""
    text = f"rejected by {decided.get('by')}: the call did not run"
    raw = decided.get("input_json")
    try:
        feedback = json.loads(raw).get("feedback") if isinstance(raw, str) else None
    except (ValueError, AttributeError):
        feedback = raw
    return f"{text}. Reason: {feedback}" if feedback else text


def _call_tool(call: ToolCall) -> CallTool:
    try:
        args = json.loads(call.args_json)
    except json.JSONDecodeError:
        args = {"_unparsable": call.args_json}
    return CallTool(
        call.call_id, call.name, args if isinstance(args, dict) else {"_value": args}
    )


def _ask_approval(
    gate: str, call: ToolCall, deadline: datetime | None, **more: str
) -> Interrupt:
    """Pause at ``gate`` for a decision on ``call`` (its tool and arguments), until
    ``deadline`` when there is one (then the call is rejected)."""
    return Interrupt(
        reason="awaiting_approval",
        gate=gate,
        detail={
            "call_id": call.call_id,
            "tool": call.name,
            "args_json": call.args_json,
            **({"decide_by": deadline.isoformat()} if deadline else {}),
            **more,
        },
        wake_at=deadline,
    )


def _deadline(state: RunState, tool: Tool[Any]) -> datetime | None:
    """A gate's deadline, counted from the run's last event (the model's answer
    that asked for the call): the same whoever plans it, whenever."""
    if tool.decide_within is None or state.updated_at is None:
        return None
    return state.updated_at + tool.decide_within


def declared_gates(agent: Agent) -> frozenset[str] | None:
    """An agent's gates when it declares them (``gates``), else None: then any gate
    name is accepted ahead of time."""
    gates = getattr(agent, "gates", None)
    if gates is None:
        return None
    return frozenset(str(g) for g in gates)


def load_agent(spec: str) -> Agent:
    """``module:attr`` -> the agent object (or the result of calling a factory).
    Modules in the current directory are found too (as ``python -m`` would)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"agent {spec!r}: expected module:attr")
    here = os.getcwd()
    if here not in sys.path and "" not in sys.path:
        sys.path.insert(0, here)
    try:
        module = import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"agent {spec!r}: cannot import {module_name}: {e}") from e
    try:
        agent = getattr(module, attr)
    except AttributeError as e:
        raise ConfigError(f"agent {spec!r}: {module_name} has no {attr}") from e
    if callable(agent) and not hasattr(agent, "plan"):
        agent = agent()
    if not hasattr(agent, "plan"):
        raise ConfigError(f"agent {spec!r} has no plan(state) method")
    return agent  # type: ignore[no-any-return]


def running_versions(agent: Any) -> Versions:
    """What ``agent``'s code is, as the version gate compares it with what a run
    started under (``run_started`` records the same)."""
    from es_agents.core.reducer import reducer_version  # noqa: PLC0415

    declared = agent.versions()
    return Versions(
        agent_version=str(declared.get("agent_version", "")),
        code_revision=code_revision(),
        prompt_hash=str(declared.get("prompt_hash", "")),
        model_id=str(declared.get("model_id", "")),
        tools_hash=str(declared.get("tools_hash", "")),
        reducer_version=reducer_version(),
    )


def code_revision() -> str:
    """The running code: the package version, plus the git commit when there is one."""
    import subprocess  # noqa: PLC0415

    from es_agents import __version__  # noqa: PLC0415

    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return f"es-agents {__version__}"
    commit = rev.stdout.strip() if rev.returncode == 0 else ""
    return f"es-agents {__version__}" + (f" git {commit}" if commit else "")
