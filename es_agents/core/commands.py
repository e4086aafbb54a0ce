"""Commands: imperative requests to a run, one Avro schema each (``schemas/commands``).

Commands are keyed by run id like events, so a run's commands and events share a
partition number. ``command_id`` makes a resent command a no-op.
"""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from es_agents.core.events import PayloadClaim, new_id, utc_now
from es_agents.core.flow import MAX_PRIORITY


class Command(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True)

    wire_name: ClassVar[str]

    command_id: str = Field(default_factory=new_id, min_length=1)
    run_id: str = Field(min_length=1)
    at: datetime = Field(default_factory=utc_now)


class StartRun(Command):
    wire_name: ClassVar[str] = "start_run"

    agent: str
    input_json: str = "{}"
    # A child run: the run that starts it, and the tool call it answers.
    parent_run_id: str | None = None
    parent_call_id: str | None = None
    # An input over the payload threshold: in the object store, input_json empty.
    claims: tuple[PayloadClaim, ...] = ()
    # The run's own limits (``core.budget``): a JSON object; None: its agent's.
    budget_json: str | None = None
    # Flow control (``core.flow``): whose run it is, and its place in the queue
    # among the agent's runs waiting for a place (higher first).
    tenant: str | None = Field(default=None, min_length=1, max_length=200)
    priority: int = Field(default=0, ge=-MAX_PRIORITY, le=MAX_PRIORITY)


class ForkRun(Command):
    """Start ``run_id`` as a copy of ``origin_run`` up to ``at_seq``; ``agent`` is the
    origin's, so that agent's workers apply it."""

    wire_name: ClassVar[str] = "fork_run"

    agent: str
    origin_run: str = Field(min_length=1)
    at_seq: int = Field(ge=0, le=2**63 - 1)
    by: str | None = None


class Approve(Command):
    wire_name: ClassVar[str] = "approve"

    by: str
    gate: str | None = None
    comment: str | None = None
    # Edited arguments (a JSON object) for the call the gate asks about.
    args_json: str | None = None
    # A signed decision (core.approvals): the key, the Ed25519 signature, expiry.
    key_id: str | None = None
    signature: bytes | None = None
    expires_at: datetime | None = None


class Reject(Command):
    wire_name: ClassVar[str] = "reject"

    by: str
    gate: str | None = None
    reason: str | None = None
    key_id: str | None = None
    signature: bytes | None = None
    expires_at: datetime | None = None


class ProvideInput(Command):
    wire_name: ClassVar[str] = "provide_input"

    by: str
    input_json: str
    # An input over the payload threshold: in the object store, input_json empty.
    claims: tuple[PayloadClaim, ...] = ()


class SendMessage(Command):
    """The next user message of a thread (a conversational run waiting with reason
    ``awaiting_message``); ``end``: the thread ends with its last reply."""

    wire_name: ClassVar[str] = "send_message"

    by: str
    text: str = ""
    end: bool = False


class Cancel(Command):
    wire_name: ClassVar[str] = "cancel"

    by: str
    reason: str | None = None


class ChildEnded(Command):
    """To a parent run: its child ended (``status``), with the child's output or
    error and usage. Sent by the child's worker once the end is durable; its id
    is ``child-ended:<child run>``, so a second send changes nothing."""

    wire_name: ClassVar[str] = "child_ended"

    call_id: str
    child_run_id: str
    status: str
    output_json: str | None = None
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    model_calls: int = 0


class FireTimer(Command):
    wire_name: ClassVar[str] = "fire_timer"

    timer_id: str
    due_at: datetime


class ChangeSchedule(Command):
    """Set, pause, resume or delete the schedule ``name`` of ``agent``
    (``core.schedules``). Its ``run_id`` is the schedule's key, ``schedule:<name>``,
    so one worker of the agent applies a schedule's changes, in order."""

    wire_name: ClassVar[str] = "change_schedule"

    by: str
    agent: str
    name: str
    action: str  # set | pause | resume | delete (another is refused)
    input_json: str = "{}"
    cron: str | None = None
    every_seconds: int | None = None
    missed: str = "skip"  # skip | one | all (core.schedules.MISSED)


COMMAND_TYPES: dict[str, type[Command]] = {
    cls.wire_name: cls
    for cls in (
        StartRun,
        ForkRun,
        Approve,
        Reject,
        ProvideInput,
        SendMessage,
        Cancel,
        FireTimer,
        ChildEnded,
        ChangeSchedule,
    )
}
