"""What the client hands back: a command's fate (``CommandResult``), a run as a
client sees it (``RunView``, with the call it waits at, ``PendingCall``), a row of
the runs table (``RunRow``), a thread's answer (``Reply``), and how inputs become
JSON (``as_json``)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, JsonValue, SerializeAsAny, SkipValidation
from pydantic.dataclasses import dataclass as pydantic_dataclass

from es_agents.core.commands import Command
from es_agents.core.state import PendingToolCall, RunState
from es_agents.errors import InvalidInput
from es_agents.ports import Position, Verdict

M = TypeVar("M", bound=BaseModel)

FINISHED_OR_WAITING = ("completed", "failed", "cancelled", "paused")


@dataclass
class Waiting:
    """One ``wait``: whether the run got there, raising ``TimeoutError`` once past
    the deadline, and how long to sleep until the next look (backing off)."""

    run_id: str
    wanted: frozenset[str]
    timeout: float
    deadline: float = 0.0
    sleep: float = 0.005

    def __post_init__(self) -> None:
        self.deadline = time.monotonic() + self.timeout

    def arrived(self, view: RunView | None) -> RunView | None:
        if view is not None and view.status in self.wanted:
            return view
        if time.monotonic() > self.deadline:
            seen = view.status if view is not None else "unknown"
            raise TimeoutError(
                f"run {self.run_id} is {seen}, not {'/'.join(sorted(self.wanted))}, "
                f"after {self.timeout:g} s"
            )
        return None

    def pause(self) -> float:
        pause, self.sleep = self.sleep, min(self.sleep * 2, 0.25)
        return pause


_TYPED = ConfigDict(arbitrary_types_allowed=True)


@pydantic_dataclass(frozen=True, config=_TYPED)
class CommandResult:
    """What became of a command: applied, refused (with the reason), or queued.
    A pydantic dataclass: ``TypeAdapter(CommandResult).dump_json(result)``."""

    command: SerializeAsAny[Command]
    status: Literal["applied", "refused", "queued"]
    reason: str | None = None
    position: Position | None = None

    @property
    def run_id(self) -> str:
        return self.command.run_id


@pydantic_dataclass(frozen=True, config=_TYPED)
class RunView:
    """A run as a client sees it: its folded state (as the fold made it, not
    revalidated), or a start still pending."""

    run_id: str
    status: str
    agent: str
    state: SkipValidation[RunState | None]
    refused: SkipValidation[list[Verdict]] = field(default_factory=list)
    dead_letters: list[tuple[str, int, int, str]] = field(default_factory=list)
    loaded_from: dict[str, int | None] = field(default_factory=dict)
    payload_problem: str | None = None  # a claim-checked payload that did not load
    archived: str | None = None  # its archive, when its rows were purged

    @property
    def pending(self) -> PendingCall | None:
        """The tool call the run waits at, typed: at a gate, the call a decision
        is asked about; or a call in flight (its outcome not yet durable). None
        when it waits on no call. Arguments that do not read as a JSON object
        (encrypted, for a client without the key) come as ``{}``."""
        state = self.state
        if state is None:
            return None
        waiting = state.waiting
        if waiting is not None and waiting.reason == "awaiting_approval":
            try:
                detail = json.loads(waiting.detail_json or "{}")
            except ValueError:
                detail = None
            if isinstance(detail, dict) and "tool" in detail:
                return PendingCall(
                    tool=str(detail["tool"]),
                    args=_object(detail.get("args_json")),
                    gate=waiting.gate,
                    call_id=str(detail.get("call_id", "")),
                    key=None,  # the call is requested once it is approved
                )
        call = state.pending
        if not isinstance(call, PendingToolCall):
            return None
        return PendingCall(
            tool=call.tool,
            args=_object(call.args_json),
            gate=None,
            call_id=call.call_id,
            key=call.idempotency_key,
        )

    def output_as(self, model: type[M]) -> M:
        """The run's output as ``model`` (a typed agent's output model); raises
        ``ValueError`` when the run has no output (yet) or it does not fit."""
        output = self.state.output_json if self.state is not None else None
        if output is None:
            raise ValueError(f"run {self.run_id} has no output (it is {self.status})")
        return model.model_validate_json(output)


@pydantic_dataclass(frozen=True)
class RunRow:
    """A run as the projector last wrote it in the ``runs`` table (``Client.runs``):
    cheap to list, behind the log by the projector's lag."""

    run_id: str
    agent: str
    status: str
    step: int
    events: int
    updated_at: datetime
    waiting_reason: str | None = None
    waiting_gate: str | None = None
    model_id: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    last_message: str | None = None  # a thread's, readable with the run's key


@dataclass(frozen=True)
class PendingCall:
    """The tool call a run waits at (``RunView.pending``): what an approval
    approves, with its arguments as a dict."""

    tool: str
    args: dict[str, Any]
    gate: str | None  # the gate asking for a decision (None: a call in flight)
    call_id: str
    key: str | None  # its idempotency key, once requested (None at a gate)


@dataclass(frozen=True)
class Reply:
    """A thread's answer: to which message (``turn``), its text, the run's status
    after it and why it waits (``awaiting_message``: for the next message;
    ``awaiting_approval``: a tool call the answer asked for needs a decision)."""

    run_id: str
    turn: int
    text: JsonValue
    status: str
    waiting: str | None = None


def _object(text: object) -> dict[str, Any]:
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        value = None
    return value if isinstance(value, dict) else {}


def as_json(value: object, what: str) -> str:
    """``value`` as JSON text: a string is taken as JSON text (and must parse), a
    pydantic model as its JSON, anything else must be a JSON value."""
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    if isinstance(value, str):
        try:
            json.loads(value)
        except ValueError as e:
            raise InvalidInput(
                f"{what} is not JSON text ({e}); pass json.dumps(...) of a string "
                "meant as a JSON string"
            ) from e
        return value
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise InvalidInput(f"{what} is not a JSON value: {e}") from e
