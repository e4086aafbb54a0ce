"""The state of one run: what the fold of its log says, nothing more."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Final, Literal

from pydantic import JsonValue

from es_agents.core.events import ToolCall
from es_agents.core.transcript import Transcript

RunStatus = Literal["running", "paused", "completed", "failed", "cancelled", "blocked"]
TERMINAL: frozenset[str] = frozenset({"completed", "failed", "cancelled"})
AWAITING_MESSAGE: Final = "awaiting_message"  # a thread between turns
AWAITING_CHILDREN: Final = "awaiting_children"  # child runs it started are running
# state_patched keys of a tool call that started a child run: "child:<call id>" ->
# the child's run id (the call is answered when the child ends: child_returned).
CHILD_PREFIX = "child:"
# A run waiting for its children looks them up in the log this long after its
# last event, and as long again after each look (a child's worker may have died
# between the child's end and telling the parent).
CHILD_LOOKUP_AFTER = timedelta(seconds=60)
GATE_PREFIX = "gate:"
# state_patched keys of gates whose deadline passed and went to other deciders:
# {"since_seq": the pause's interrupted seq, "decide_by": the new deadline}.
ESCALATED_PREFIX = "escalated:"
# A redelivered command comes back within a few of its run's commands (its offset
# was not committed yet); a thread keeps the ids of its last messages only.
MESSAGE_IDS_KEPT = 32  # state_patched keys that hold a decision taken ahead of a gate


@dataclass(slots=True)
class PendingModelCall:
    """A ``model_call_requested`` with no ``model_responded`` yet."""

    step: int
    seq: int
    messages_hash: str
    attempt: int


@dataclass(slots=True)
class PendingToolCall:
    """A ``tool_call_requested`` with no ``tool_returned`` yet."""

    step: int
    seq: int
    call_id: str
    tool: str
    args_json: str
    idempotency_key: str
    side_effect: bool


@dataclass(slots=True)
class Waiting:
    """Why a paused run waits, and since which event."""

    reason: str
    detail_json: str
    wake_at: datetime | None
    since_seq: int
    gate: str | None = None
    approvals: list[str] = field(default_factory=list)  # towards a quorum
    refusals: int = 0  # decisions refused at this pause (only the first are events)
    # Signed approvals counted towards the quorum, each as the evidence that lets
    # it be verified again (``core.approvals.unproven``).
    signed: list[dict[str, JsonValue]] = field(default_factory=list)


@dataclass(slots=True)
class Versions:
    """What the run started under; the version gate compares it to the running code."""

    agent_version: str = ""
    code_revision: str = ""
    prompt_hash: str = ""
    model_id: str = ""
    tools_hash: str = ""
    reducer_version: int = 1


@dataclass(slots=True)
class LastResume:
    reason: str
    by: str | None
    input_json: str | None
    seq: int
    gate: str | None = None


@dataclass(slots=True)
class RunState:
    """A run's state. ``seq`` is the last folded sequence number (-1: nothing yet)."""

    run_id: str
    agent: str = ""
    input_json: str = "null"
    status: RunStatus = "running"
    seq: int = -1
    step: int = 0
    transcript: Transcript = field(default_factory=Transcript)
    open_tool_calls: list[ToolCall] = field(default_factory=list)
    last_outcome_seq: int = -1  # seq of the last model_responded or tool_returned
    # The call in flight: a model call, or the earliest of the tool calls in flight
    # (``pending_tools``: those requested together, run concurrently).
    pending: PendingModelCall | PendingToolCall | None = None
    pending_tools: list[PendingToolCall] = field(default_factory=list)
    waiting: Waiting | None = None
    vars: dict[str, JsonValue] = field(default_factory=dict)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model_calls: int = 0
    model_attempts: int = 0
    tool_calls: int = 0
    reconciled_calls: int = 0
    turns: int = 0  # a thread's user messages after its input (message_received)
    # The ids of a thread's last messages (``MESSAGE_IDS_KEPT``), so a redelivered
    # message changes nothing while snapshots stay flat in the number of turns.
    message_ids: list[str] = field(default_factory=list)
    last_resume: LastResume | None = None
    # Decisions taken on a gate before the run reached it ("gate:<name>" patches).
    early_decisions: dict[str, dict[str, JsonValue]] = field(default_factory=dict)
    # The last decision per gate: {"reason": approved|rejected, "by": ..., "seq": n}.
    gate_decisions: dict[str, dict[str, JsonValue]] = field(default_factory=dict)
    # Commands already applied, so a redelivered command changes nothing.
    command_ids: set[str] = field(default_factory=set)
    output_json: str | None = None
    error: str | None = None
    versions: Versions = field(default_factory=Versions)
    migrations: list[tuple[str, str]] = field(default_factory=list)
    # The version gate's last recorded decision (a migrated event or a refusal).
    last_gate: dict[str, JsonValue] | None = None
    started_at: datetime | None = None
    updated_at: datetime | None = None
    # A fork: the run its log was copied from, and the last seq copied.
    origin_run: str | None = None
    origin_seq: int | None = None
    # A child run: the run that started it, and that run's tool call it answers.
    parent_run_id: str | None = None
    parent_call_id: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.transcript, Transcript):  # a list of messages
            self.transcript = Transcript(self.transcript)

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def children(self) -> dict[str, str]:
        """The child runs it started that have not ended: call id -> run id."""
        return {
            k[len(CHILD_PREFIX) :]: str(v)
            for k, v in self.vars.items()
            if k.startswith(CHILD_PREFIX) and isinstance(v, str)
        }

    @property
    def thread(self) -> bool:
        """A conversational run: it waited for, or received, a next message."""
        return self.turns > 0 or (
            self.waiting is not None and self.waiting.reason == AWAITING_MESSAGE
        )
