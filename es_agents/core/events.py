"""Run events: past-tense facts, one Avro schema each (``schemas/events``).

Every event carries the run id (the Kafka key), a per-run sequence number, the step it
belongs to, a unique event id, the writer's time and ``prev``, the hash of its run's
previous event as written (``es_agents.chain``). The schema version is not a field:
the codec identifies the writer schema on the wire by its fingerprint.
"""

from __future__ import annotations

import os
import random
from datetime import UTC, datetime
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from es_agents.core.reducer import reducer_version as running_reducer

# Event ids: random UUIDs (version 4) from a generator seeded by the OS once per
# process (and again in a forked child), not a system call per id -- uuid4()'s
# os.urandom was a tenth of a worker's CPU per step on a busy machine.
_ids = random.Random(os.urandom(32))  # noqa: S311 - unique ids, not secrets
os.register_at_fork(after_in_child=lambda: _ids.seed(os.urandom(32)))
_V4 = (0x4000 << 64) | (0x8000 << 48)
_V4_MASK = ~((0xF000 << 64) | (0xC000 << 48))


def new_id() -> str:
    h = "%032x" % (_ids.getrandbits(128) & _V4_MASK | _V4)
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def utc_now() -> datetime:
    # Avro timestamp-millis keeps milliseconds; truncating here makes a decoded event
    # equal to the one that was encoded.
    now = datetime.now(UTC)
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


class Event(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    wire_name: ClassVar[str]

    run_id: str
    seq: int = Field(ge=0, le=2**63 - 1)  # Avro long
    step: int = Field(ge=0, le=2**31 - 1)  # Avro int
    event_id: str = Field(default_factory=new_id)
    at: datetime = Field(default_factory=utc_now)
    # SHA-256 of the run's previous event's bytes as written; b"" for run_started.
    # Set when the event is sealed for the log (core.chain), not by the planner.
    prev: bytes = b""


class ToolCall(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    call_id: str
    name: str
    args_json: str


class PayloadClaim(BaseModel):
    """A field kept in the object store (claim check); the event's field is empty."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    field: str  # e.g. "result_json", "content", "tool_calls.0.args_json"
    sha256: str
    size: int
    key: str


class Usage(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    prompt_tokens: int = 0
    completion_tokens: int = 0


class RunStarted(Event):
    wire_name: ClassVar[str] = "run_started"

    agent: str
    input_json: str
    command_id: str
    agent_version: str = ""
    code_revision: str = ""
    prompt_hash: str = ""
    model_id: str = ""
    tools_hash: str = ""
    # The fold's rules the run started under; built here without one: the
    # running code's (records written without the field decode to 1).
    reducer_version: int = Field(default_factory=running_reducer)
    # A child run: the run that started it, and the tool call it answers.
    parent_run_id: str | None = None
    parent_call_id: str | None = None
    claims: tuple[PayloadClaim, ...] = ()  # an input in the object store


class ModelCallRequested(Event):
    wire_name: ClassVar[str] = "model_call_requested"

    messages_hash: str
    message_count: int
    params_json: str
    attempt: int = 1


class ModelResponded(Event):
    wire_name: ClassVar[str] = "model_responded"

    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str = "stop"
    usage: Usage = Usage()
    model_id: str = ""
    claims: tuple[PayloadClaim, ...] = ()


class ToolCallRequested(Event):
    wire_name: ClassVar[str] = "tool_call_requested"

    call_id: str
    tool: str
    args_json: str
    idempotency_key: str
    side_effect: bool = True
    claims: tuple[PayloadClaim, ...] = ()


class ToolReturned(Event):
    wire_name: ClassVar[str] = "tool_returned"

    call_id: str
    result_json: str | None = None
    error: str | None = None
    reconciled: bool = False
    claims: tuple[PayloadClaim, ...] = ()


class StatePatched(Event):
    wire_name: ClassVar[str] = "state_patched"

    key: str
    value_json: str


class Interrupted(Event):
    wire_name: ClassVar[str] = "interrupted"

    reason: str
    detail_json: str = "{}"
    wake_at: datetime | None = None


class Resumed(Event):
    wire_name: ClassVar[str] = "resumed"

    reason: str
    command_id: str | None = None
    by: str | None = None
    input_json: str | None = None
    claims: tuple[PayloadClaim, ...] = ()
    args_hash: str | None = None  # an approval: the arguments it approved
    # A signed approval, as its command carried it (verified again before the
    # approved call runs: the writer's MAC shows who appended, not who decided).
    key_id: str | None = None
    signature: bytes | None = None
    expires_at: datetime | None = None


class MessageReceived(Event):
    """A thread's next user message: the paused conversation goes on with it."""

    wire_name: ClassVar[str] = "message_received"

    text: str
    by: str
    command_id: str
    claims: tuple[PayloadClaim, ...] = ()


class ChildReturned(Event):
    """A child run ended; its output (or its failure) is the result of the parent's
    tool call that started it, and its usage counts in the parent's."""

    wire_name: ClassVar[str] = "child_returned"

    call_id: str
    child_run_id: str
    status: str  # completed | failed | cancelled
    output_json: str | None = None
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model_calls: int = 0
    command_id: str
    claims: tuple[PayloadClaim, ...] = ()


class ApprovalRecorded(Event):
    """An approval counted towards the gate's quorum; the run keeps waiting."""

    wire_name: ClassVar[str] = "approval_recorded"

    gate: str
    by: str
    command_id: str
    key_id: str | None = None
    args_hash: str | None = None
    signature: bytes | None = None  # a signed approval's, kept to verify again
    expires_at: datetime | None = None


class DecisionRefused(Event):
    """A decision the gate's policy refused, with the reason; nothing else changed."""

    wire_name: ClassVar[str] = "decision_refused"

    gate: str | None = None
    decision: str
    by: str
    command_id: str
    key_id: str | None = None
    reason: str


class RunCompleted(Event):
    wire_name: ClassVar[str] = "run_completed"

    output_json: str
    claims: tuple[PayloadClaim, ...] = ()


class RunFailed(Event):
    wire_name: ClassVar[str] = "run_failed"

    error: str
    kind: str = "error"


class Migrated(Event):
    wire_name: ClassVar[str] = "migrated"

    from_version: str
    to_version: str
    changes_json: str = "{}"


class Forked(Event):
    """This run's log so far is a copy of another run's up to ``origin_seq`` (with
    this run's id and its own idempotency keys); it goes on from here."""

    wire_name: ClassVar[str] = "forked"

    origin_run: str
    origin_seq: int
    origin_head: bytes  # digest of the origin's event at origin_seq: the chains' link
    command_id: str
    by: str | None = None


EVENT_TYPES: dict[str, type[Event]] = {
    cls.wire_name: cls
    for cls in (
        RunStarted,
        ModelCallRequested,
        ModelResponded,
        ToolCallRequested,
        ToolReturned,
        StatePatched,
        Interrupted,
        Resumed,
        RunCompleted,
        RunFailed,
        Migrated,
        Forked,
        ApprovalRecorded,
        DecisionRefused,
        MessageReceived,
        ChildReturned,
    )
}
