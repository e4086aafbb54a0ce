"""Tools: plain Python callables with a pydantic args model and a declared contract.

A tool declares whether it has side effects, whether its downstream honors idempotency
keys, and may offer ``lookup(key)`` so a call left dangling by a crash can be
reconciled by asking the downstream what happened.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from es_agents.core.approvals import ApprovalPolicy
from es_agents.core.step import canonical_json
from es_agents.errors import TerminalToolError
from es_agents.typed import problems

A = TypeVar("A", bound=BaseModel)

# A tool's function: plain (run on a thread of the worker's bounded call pool) or
# ``async def`` (awaited on the worker's event loop, no thread).
ToolFn = Callable[[A, "ToolContext"], JsonValue | Awaitable[JsonValue]]


@dataclass(frozen=True)
class ToolContext:
    """What a tool gets besides its arguments.

    ``partition`` and ``epoch`` are the fencing token of the calling worker: the epoch
    grows each time the run's partition changes owner. A downstream that remembers
    the highest epoch it saw per partition can refuse a lower one (a worker that lost
    the partition but does not know it yet); the tool then raises ``FencedError``, the
    worker stops the run, and the partition's owner makes the call.
    """

    run_id: str
    step: int
    idempotency_key: str  # run_id:step; pass it to the downstream
    attempt: int = 1
    partition: int = -1
    epoch: int = 0

    @property
    def fencing_token(self) -> str:
        """``p<partition>.e<epoch>``, for a header."""
        return f"p{self.partition}.e{self.epoch}"


@dataclass(frozen=True)
class Lookup:
    """What the downstream knows of a key: done (with the result), absent, unknown."""

    status: Literal["done", "absent", "unknown"]
    result: JsonValue = None

    @classmethod
    def done(cls, result: JsonValue) -> Lookup:
        return cls("done", result)

    @classmethod
    def absent(cls) -> Lookup:
        return cls("absent")

    @classmethod
    def unknown(cls) -> Lookup:
        return cls("unknown")


@dataclass(frozen=True)
class Tool(Generic[A]):
    name: str
    fn: ToolFn[A]
    args_model: type[A]
    description: str = ""
    side_effect: bool = True
    honors_idempotency_key: bool = False
    lookup: Callable[[str], Lookup] | None = None
    requires_approval: bool = False
    # Who decides the gate (core.approvals): approvers, roles, quorum, signatures.
    approval: ApprovalPolicy | None = None
    # Seconds a call may take; past it a side-effect-free call is an error the model
    # sees, and a side-effecting one pauses the run as an uncertain effect.
    timeout: float | None = 120.0
    # A rejected call: "end" the run (completed, saying what was rejected), or
    # "tell_model": the rejection and the approver's reason are the call's result,
    # and the model goes on (it may try another way).
    on_reject: Literal["end", "tell_model"] = "end"
    # A person answers the call (``ask_human``): nothing runs; the run waits for
    # the answer (provide-input), checked against ``answer_model`` when given.
    asks_human: bool = False
    answer_model: type[BaseModel] | None = None
    # A gate's deadline: a call nobody decided this long after the model asked for
    # it is rejected (on the durable timers; on_reject says what follows) -- or,
    # with ``escalate_to``, first handed to those deciders for as long again.
    decide_within: timedelta | None = None
    escalate_to: ApprovalPolicy | None = None
    # A sub-agent (``subagent``): the call starts a child run of this agent, and
    # the child's output is the call's result.
    child_agent: str | None = None

    def parse(self, args: dict[str, JsonValue]) -> A:
        try:
            return self.args_model.model_validate(args)
        except ValidationError as e:  # said without the values: some may be secret
            raise TerminalToolError(
                f"{self.name}: invalid arguments: {problems(e, 'arguments')}"
            ) from e

    def __call__(
        self, args: dict[str, JsonValue], ctx: ToolContext
    ) -> JsonValue | Awaitable[JsonValue]:
        """The call: its result, or for an ``async def`` tool its awaitable."""
        return self.fn(self.parse(args), ctx)

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    @property
    def needs_dedupe_table(self) -> bool:
        """Side effects, no key honored downstream, no lookup: guard with the table."""
        return (
            self.side_effect and not self.honors_idempotency_key and self.lookup is None
        )

    def schema(self) -> dict[str, JsonValue]:
        return {
            "name": self.name,
            "description": self.description,
            "parameters": self.args_model.model_json_schema(),
        }


def tool(
    args_model: type[A],
    *,
    name: str | None = None,
    side_effect: bool = True,
    honors_idempotency_key: bool = False,
    lookup: Callable[[str], Lookup] | None = None,
    requires_approval: bool = False,
    approval: ApprovalPolicy | None = None,
    timeout: float | None = 120.0,
    on_reject: Literal["end", "tell_model"] = "end",
    decide_within: timedelta | None = None,
    escalate_to: ApprovalPolicy | None = None,
) -> Callable[[ToolFn[A]], Tool[A]]:
    """Declare a tool: ``@tool(Args, honors_idempotency_key=True)``. ``approval``
    (an ``ApprovalPolicy``) implies ``requires_approval``."""

    if escalate_to is not None and decide_within is None:
        raise ValueError("escalate_to needs decide_within: when to escalate")

    def wrap(fn: ToolFn[A]) -> Tool[A]:
        return Tool(
            name=name or fn.__name__,
            fn=fn,
            args_model=args_model,
            description=(fn.__doc__ or "").strip(),
            side_effect=side_effect,
            honors_idempotency_key=honors_idempotency_key,
            lookup=lookup,
            requires_approval=requires_approval or approval is not None,
            approval=approval,
            timeout=timeout,
            on_reject=on_reject,
            decide_within=decide_within,
            escalate_to=escalate_to,
        )

    return wrap


def tools_hash(tools: list[Tool[BaseModel]] | tuple[Tool[BaseModel], ...]) -> str:
    schemas = sorted((t.schema() for t in tools), key=lambda s: str(s["name"]))
    return "sha256:" + hashlib.sha256(canonical_json(schemas).encode()).hexdigest()


class Question(BaseModel):
    question: str = Field(description="The question, in full: the person sees it alone")


def ask_human(
    answer: type[BaseModel] | None = None,
    *,
    name: str = "ask_human",
    description: str = (
        "Ask a person and wait for the answer (it may take days). Use it when you "
        "need a fact or a choice only a person can give."
    ),
) -> Tool[Question]:
    """A tool the model calls to ask a person: the run pauses (``awaiting_input``,
    with the question, and ``answer``'s JSON Schema when given) as a row; an input
    (``provide-input``, the UI) answers it, checked against ``answer`` -- one that
    does not fit asks again, saying why -- and the answer is the call's result."""

    def unreachable(args: Question, ctx: ToolContext) -> JsonValue:
        raise TerminalToolError(f"{name} is answered by a person, never run")

    return Tool(
        name=name,
        fn=unreachable,
        args_model=Question,
        description=description,
        side_effect=False,
        asks_human=True,
        answer_model=answer,
    )


class Arguments(BaseModel):
    """A tool's arguments as the model gave them, for a tool whose schema is a
    JSON Schema of its own (``SchemaTool``): checked by the tool, not here."""

    model_config = ConfigDict(extra="allow")


@dataclass(frozen=True)
class SchemaTool(Tool[Arguments]):
    """A tool described by a JSON Schema from elsewhere (an MCP server, another
    agent framework): the model is offered ``parameters`` as they are."""

    parameters: dict[str, Any] = field(default_factory=dict)

    def schema(self) -> dict[str, JsonValue]:
        return {
            "name": self.name,
            "description": self.description,
            "parameters": self.parameters,
        }


class Task(BaseModel):
    task: str = Field(description="The task, in full: the other agent sees it alone")


def subagent(
    agent: str,
    *,
    name: str | None = None,
    description: str | None = None,
    input_model: type[BaseModel] = Task,
    requires_approval: bool = False,
    approval: ApprovalPolicy | None = None,
) -> Tool[Any]:
    """A tool that hands a task to another agent as a child run: the call starts a
    run of ``agent`` (its input: the call's arguments, ``input_model``), the run
    waits for it as a row, and the child's output (or failure) is the call's
    result. Several calls at once run as several children, joined when all end."""

    def unreachable(args: BaseModel, ctx: ToolContext) -> JsonValue:
        raise TerminalToolError(f"{agent}: a child run is started, never called")

    return Tool(
        name=name or agent.replace("-", "_"),
        fn=unreachable,
        args_model=input_model,
        description=description or f"Hand a task to the {agent} agent; get its answer.",
        side_effect=True,
        honors_idempotency_key=True,  # the child's id is the key's: started once
        requires_approval=requires_approval or approval is not None,
        approval=approval,
        timeout=None,
        child_agent=agent,
    )
