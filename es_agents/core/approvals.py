"""Who may decide a gate, and what a decision must carry: pure rules, no crypto.

A gate's ``ApprovalPolicy`` names its approvers (identities and/or roles), how many
distinct approvers it takes (``quorum``: 2 is four-eyes) and whether decisions must
be signed. A signed decision is an Ed25519 signature over ``signed_payload``: the
run, the gate, the pause it answers (step and the ``interrupted`` event's seq), the
decision, the hash of the arguments being approved, the approver and an expiry. The
runtime (``es_agents.approvals``) checks the signature against the approver's public
key; ``judge`` here decides the rest from the run's state.

A decision that ``judge`` refuses is recorded in the run's log as
``decision_refused`` with the reason; an approval that does not complete a quorum
is recorded as ``approval_recorded``; the one that completes it resumes the run.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from es_agents.core.commands import Approve, FireTimer, Reject
from es_agents.core.events import Event, StatePatched
from es_agents.core.state import ESCALATED_PREFIX, RunState
from es_agents.core.step import EventBuilder, args_hash, canonical_json, timer_id


@dataclass(frozen=True)
class ApprovalPolicy:
    """Who decides a gate. No approvers and no roles: anyone (by name)."""

    approvers: frozenset[str] = field(default_factory=frozenset)
    roles: frozenset[str] = field(default_factory=frozenset)
    quorum: int = 1
    signed: bool = False

    def __post_init__(self) -> None:
        if self.quorum < 1:
            raise ValueError("quorum must be at least 1")
        object.__setattr__(self, "approvers", frozenset(self.approvers))
        object.__setattr__(self, "roles", frozenset(self.roles))

    def allows(self, identity: str, roles: frozenset[str]) -> bool:
        if not self.approvers and not self.roles:
            return True
        return identity in self.approvers or bool(self.roles & roles)


@dataclass(frozen=True)
class ApproverKey:
    """A registered public key: whose it is and the roles it speaks for."""

    key_id: str
    identity: str
    roles: frozenset[str]
    public_key: bytes  # raw Ed25519, 32 bytes
    revoked: bool = False


@dataclass(frozen=True)
class Pause:
    """What a decision answers: the gate a run waits at and the call it approves."""

    run_id: str
    gate: str
    step: int
    seq: int
    args_hash: str | None
    approvals: tuple[str, ...]


def pause_of(state: RunState) -> Pause | None:
    """The approval pause the run is in, if it is in one."""
    waiting = state.waiting
    if waiting is None or waiting.reason != "awaiting_approval" or not waiting.gate:
        return None
    try:
        detail = json.loads(waiting.detail_json or "{}")
    except json.JSONDecodeError:
        detail = {}
    raw = detail.get("args_json") if isinstance(detail, dict) else None
    return Pause(
        run_id=state.run_id,
        gate=waiting.gate,
        step=state.step,
        seq=waiting.since_seq,
        args_hash=args_hash(raw) if isinstance(raw, str) else None,
        approvals=tuple(waiting.approvals),
    )


def signed_payload(
    pause: Pause, decision: str, by: str, key_id: str, expires_at: datetime
) -> bytes:
    """The bytes an approver signs for ``decision`` on ``pause``."""
    return canonical_json(
        {
            "run_id": pause.run_id,
            "gate": pause.gate,
            "step": pause.step,
            "seq": pause.seq,
            "decision": decision,
            "args_hash": pause.args_hash,
            "by": by,
            "key_id": key_id,
            "expires_at": expires_at.isoformat(),
        }
    ).encode()


def answered(pause: Pause, command: Approve | Reject) -> Pause:
    """The pause as the decision answers it: an approval with edited arguments
    approves those (their hash is what a signature binds)."""
    if isinstance(command, Approve) and command.args_json is not None:
        return replace(pause, args_hash=args_hash(command.args_json))
    return pause


def escalated(state: RunState, gate: str) -> bool:
    """Whether the pause the run is in now was escalated (its deadline passed and
    the gate went to its other deciders)."""
    mark = state.vars.get(ESCALATED_PREFIX + gate)
    waiting = state.waiting
    return (
        isinstance(mark, dict)
        and waiting is not None
        and mark.get("since_seq") == waiting.since_seq
    )


def escalation(
    state: RunState, command: FireTimer, within: Mapping[str, timedelta]
) -> tuple[list[Event], datetime] | None:
    """A deadline firing at an approval pause whose gate escalates (``within``:
    the gates that do, and how long the new deciders have), the first time: the
    mark that hands the gate over, and the new deadline. None otherwise (then
    ``decide`` rejects the call, or the timer is stale)."""
    waiting = state.waiting
    gate = waiting.gate if waiting is not None else None
    if (
        waiting is None
        or gate is None
        or waiting.reason != "awaiting_approval"
        or gate not in within
        or timer_id(state.run_id, waiting.since_seq) != command.timer_id
        or escalated(state, gate)
    ):
        return None
    due = command.due_at + within[gate]
    out = EventBuilder(state)
    out.add(
        StatePatched,
        key=ESCALATED_PREFIX + gate,
        value_json=canonical_json(
            {"since_seq": waiting.since_seq, "decide_by": due.isoformat()}
        ),
    )
    return out.events, due


def decision_of(command: Approve | Reject) -> str:
    return "approved" if isinstance(command, Approve) else "rejected"


@dataclass(frozen=True)
class Verdict:
    """``refused``: the reason; else ``complete``: the decision resumes the run
    (False: an approval recorded towards the quorum)."""

    refused: str | None = None
    complete: bool = True


def judge(  # noqa: PLR0911, PLR0912 - one return per reason
    pause: Pause | None,
    command: Approve | Reject,
    *,
    policy: ApprovalPolicy,
    key: ApproverKey | None,
    signature_ok: bool,
    now: datetime,
) -> Verdict:
    """Whether a decision on a gate with ``policy`` stands. ``key``: the registered
    key the command names (None: unsigned or unknown); ``signature_ok``: the
    signature verifies over ``signed_payload`` of ``pause`` with that key."""
    gate = command.gate or (pause.gate if pause else None)
    if pause is None or (command.gate is not None and command.gate != pause.gate):
        if policy.signed or policy.quorum > 1 or policy.approvers or policy.roles:
            return Verdict(
                f"gate {gate!r} has approvers: it is decided while the run waits "
                "there, not ahead of time"
            )
        return Verdict()
    signed = command.signature is not None
    if policy.signed and not signed:
        return Verdict(f"gate {pause.gate!r} requires a signed decision (--key)")
    roles: frozenset[str] = frozenset()
    if signed:
        if key is None:
            return Verdict(f"unknown key {command.key_id!r}")
        if key.revoked:
            return Verdict(f"key {key.key_id} is revoked")
        if key.identity != command.by:
            return Verdict(
                f"key {key.key_id} belongs to {key.identity!r}, not {command.by!r}"
            )
        if command.expires_at is None or command.expires_at <= now:
            return Verdict(f"the signed decision expired at {command.expires_at}")
        if not signature_ok:
            return Verdict(
                "the signature does not match this pause (forged, altered, or "
                "signed for another pause or other arguments)"
            )
        roles = key.roles
    if not policy.allows(command.by, roles):
        return Verdict(f"{command.by!r} may not decide gate {pause.gate!r}")
    if isinstance(command, Reject):
        return Verdict()
    if command.args_json is not None and policy.quorum > 1:
        return Verdict(
            f"gate {pause.gate!r} takes {policy.quorum} approvals: its arguments "
            "cannot be edited by one of them"
        )
    if command.by in pause.approvals:
        return Verdict(f"{command.by!r} already approved gate {pause.gate!r}")
    return Verdict(complete=len(pause.approvals) + 1 >= policy.quorum)


def unproven(  # noqa: PLR0911 - one return per reason
    run_id: str,
    gate: str,
    decided: Mapping[str, object],
    policy: ApprovalPolicy,
    *,
    key_of: Callable[[str], ApproverKey | None],
    verifies: Callable[[bytes, bytes, bytes], bool],
) -> str | None:
    """Why the approval ``decided`` (the run's ``gate_decisions[gate]``) does not
    prove itself under a ``signed`` ``policy``, or None when it does.

    Checked again from the log alone, whoever appended it: each signed approval
    kept with the decision (``signed``) verifies over the pause it answered with
    the key it names, that key is its approver's and the approver may decide the
    gate, it was appended before it expired and approves the arguments decided;
    and as many distinct approvers signed as the quorum takes. ``key_of``: the
    registered key by id; ``verifies(public_key, payload, signature)``."""
    if not policy.signed or decided.get("reason") != "approved":
        return None
    evidence = decided.get("signed")
    if not isinstance(evidence, list) or not evidence:
        return f"gate {gate!r} requires signed approvals; the decision carries none"
    approvers: set[str] = set()
    for item in evidence:
        if not isinstance(item, dict):
            return "a signed approval's evidence is not readable"
        by, key_id = str(item.get("by")), str(item.get("key_id"))
        try:
            expires = datetime.fromisoformat(str(item.get("expires_at")))
            at = datetime.fromisoformat(str(item.get("at")))
            signature = bytes.fromhex(str(item.get("signature")))
            pause = Pause(
                run_id,
                gate,
                int(item["step"]),
                int(item["seq"]),
                item.get("args_hash")
                if isinstance(item.get("args_hash"), str)
                else None,
                (),
            )
        except (KeyError, TypeError, ValueError):
            return f"the approval by {by!r}: its evidence is not readable"
        key = key_of(key_id)
        if key is None:
            return f"the approval by {by!r}: key {key_id} is not registered"
        if key.identity != by:
            return f"the approval by {by!r}: key {key_id} is {key.identity!r}'s"
        if not policy.allows(by, key.roles):
            return f"the approval by {by!r}: {by!r} may not decide gate {gate!r}"
        if pause.args_hash != decided.get("args_hash"):
            return f"the approval by {by!r} approved other arguments"
        if at > expires:
            return f"the approval by {by!r} was appended after it expired"
        payload = signed_payload(pause, "approved", by, key_id, expires)
        if not verifies(key.public_key, payload, signature):
            return (
                f"the approval by {by!r}: the signature does not verify (forged or "
                "altered after it was judged)"
            )
        approvers.add(by)
    if len(approvers) < policy.quorum:
        return (
            f"gate {gate!r} takes {policy.quorum} signed approvals; "
            f"{len(approvers)} verify"
        )
    return None
