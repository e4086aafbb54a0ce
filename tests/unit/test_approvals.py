"""Authorized, signed approvals on the in-memory stack: a four-eyes gate whose
decisions must be signed. Every refused decision is recorded in the run's log as
``decision_refused`` with its reason and gets a ``refused`` verdict; two distinct
approvers resume the run; the tool runs once."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel, JsonValue

from es_agents.agent import ToolAgent
from es_agents.approvals import MemoryKeyring, SigningKey, new_key
from es_agents.audit import audit
from es_agents.core.approvals import ApprovalPolicy, Pause, judge, pause_of
from es_agents.core.commands import Approve, Reject
from es_agents.core.events import (
    ApprovalRecorded,
    DecisionRefused,
    Event,
    Resumed,
    ToolCall,
    ToolCallRequested,
)
from es_agents.core.state import RunState
from es_agents.core.step import CallTool, Interrupt, args_hash
from es_agents.models import ScriptedModel, call, reply
from es_agents.runtime.run_loop import REFUSALS_LOGGED
from es_agents.testing import AgentHarness
from es_agents.tools import ToolContext, tool

WIRES: list[int] = []


class Wire(BaseModel):
    amount: int


FOUR_EYES = ApprovalPolicy(
    approvers=frozenset({"alice"}), roles=frozenset({"finance"}), quorum=2, signed=True
)


@tool(Wire, approval=FOUR_EYES)
def wire(args: Wire, ctx: ToolContext) -> JsonValue:
    """Sends money."""
    WIRES.append(args.amount)
    return {"sent": args.amount}


def _agent() -> ToolAgent:
    script = [
        call("wire", "c1", amount=100),
        call("wire", "c2", amount=200),
        reply("done"),
    ]
    return ToolAgent(
        name="payer",
        system_prompt="Pay.",
        model=ScriptedModel(script),
        tool_list=[wire],
    )


class Keys:
    """Keys registered in the harness's keyring, by name."""

    def __init__(self, ring: MemoryKeyring) -> None:
        self.ring = ring
        self.signing: dict[str, SigningKey] = {}

    def make(self, name: str, identity: str, *roles: str) -> SigningKey:
        pem, key = new_key(identity, frozenset(roles))
        self.ring.add(key)
        self.signing[name] = SigningKey.load(pem)
        return self.signing[name]


def _signed(
    key: SigningKey,
    pause: Pause,
    by: str,
    *,
    reject: bool = False,
    valid_for: timedelta = timedelta(minutes=5),
) -> Approve | Reject:
    decision = "rejected" if reject else "approved"
    signature, expires = key.sign(pause, decision, by, valid_for)
    kind = Reject if reject else Approve
    return kind(
        run_id=pause.run_id,
        by=by,
        key_id=key.key_id,
        signature=signature,
        expires_at=expires,
    )


def _refusals(h: AgentHarness, run_id: str) -> list[str]:
    return [e.reason for e in h.events(run_id) if isinstance(e, DecisionRefused)]


def _verdict(h: AgentHarness, command: Approve | Reject) -> tuple[str, str | None]:
    found = h.ports.book.for_run(command.run_id)
    mine = next(v for v in found if v.command_id == command.command_id)
    return mine.status, mine.reason


@pytest.fixture
def paused(
    es_harness: Callable[[Any], AgentHarness],
) -> tuple[AgentHarness, str, Keys]:
    WIRES.clear()
    h = es_harness(_agent())
    assert isinstance(h.ports.keyring, MemoryKeyring)
    keys = Keys(h.ports.keyring)
    run_id = h.start()
    h.run()
    assert h.state(run_id).waiting is not None
    return h, run_id, keys


def test_every_refused_decision_is_recorded_with_its_reason(
    paused: tuple[AgentHarness, str, Keys],
) -> None:
    h, run_id, keys = paused
    alice = keys.make("alice", "alice")
    mallory = keys.make("mallory", "mallory")
    revoked = keys.make("old", "alice")
    assert keys.ring.revoke(revoked.key_id)
    outsider = SigningKey.load(new_key("alice", frozenset())[0])  # not registered
    pause = pause_of(h.state(run_id))
    assert pause is not None
    other_args = Pause(**{**pause.__dict__, "args_hash": args_hash('{"amount":9}')})
    good = _signed(alice, pause, "alice")
    cases: list[tuple[Approve | Reject, str]] = [
        (Approve(run_id=run_id, by="alice"), "requires a signed decision"),
        (_signed(mallory, pause, "mallory"), "may not decide"),
        (_signed(mallory, pause, "alice"), "belongs to 'mallory'"),  # impersonation
        (
            good.model_copy(
                update={"signature": _signed(mallory, pause, "alice").signature}
            ),
            "does not match",  # forged: another key's signature
        ),
        (
            good.model_copy(
                update={"expires_at": good.expires_at + timedelta(hours=9)}  # type: ignore[operator]
            ),
            "does not match",  # altered after signing
        ),
        (_signed(alice, other_args, "alice"), "does not match"),  # other arguments
        (_signed(alice, pause, "alice", valid_for=timedelta(seconds=-1)), "expired"),
        (_signed(revoked, pause, "alice"), "revoked"),
        (_signed(outsider, pause, "alice"), "unknown key"),
    ]
    for command, _ in cases:
        h.ports.log.send(command)
    h.run()
    reasons = _refusals(h, run_id)
    assert len(reasons) == len(cases), reasons
    for (command, expected), reason in zip(cases, reasons, strict=True):
        assert expected in reason, (expected, reason)
        assert _verdict(h, command) == ("refused", reason)
    state = h.state(run_id)
    assert state.status == "paused"
    assert state.waiting is not None
    assert state.waiting.approvals == []
    assert WIRES == []


def test_refusals_cannot_grow_the_log_without_end(
    paused: tuple[AgentHarness, str, Keys],
) -> None:
    """Anyone who may send commands could grow a gated run's log by sending refused
    decisions: the first ``REFUSALS_LOGGED`` of a pause are events, the rest are
    refused as well, with the verdict in the commands ledger only."""
    h, run_id, _ = paused
    before = len(h.events(run_id))
    flood = [
        Approve(run_id=run_id, by=f"mallory{i}") for i in range(REFUSALS_LOGGED * 3)
    ]
    for command in flood:
        h.ports.log.send(command)
    h.run()
    assert len(_refusals(h, run_id)) == REFUSALS_LOGGED
    assert len(h.events(run_id)) == before + REFUSALS_LOGGED
    for command in flood:
        status, reason = _verdict(h, command)
        assert status == "refused"
        assert reason is not None
        assert "requires a signed decision" in reason
    state = h.state(run_id)
    assert state.status == "paused"
    assert state.waiting is not None
    assert state.waiting.refusals == REFUSALS_LOGGED
    assert WIRES == []


def test_four_eyes_take_two_distinct_approvers_and_bind_the_pause(
    paused: tuple[AgentHarness, str, Keys],
) -> None:
    h, run_id, keys = paused
    alice = keys.make("alice", "alice")
    bob = keys.make("bob", "bob", "finance")
    first = pause_of(h.state(run_id))
    assert first is not None
    by_alice = _signed(alice, first, "alice")
    h.ports.log.send(by_alice)
    h.run()
    assert _verdict(h, by_alice) == (
        "applied",
        "approval 1 of 2 recorded; the run waits for the others",
    )
    assert h.state(run_id).waiting is not None
    again = _signed(alice, first, "alice")  # a new command, validly signed
    h.ports.log.send(again)
    h.ports.log.send(by_alice)  # the same command again: a no-op
    h.run()
    assert _refusals(h, run_id) == ["'alice' already approved gate 'wire'"]
    h.ports.log.send(_signed(bob, first, "bob"))
    h.run()
    assert WIRES == [100]  # resumed by the second approver: the tool ran once
    second = pause_of(h.state(run_id))
    assert second is not None
    assert second.seq > first.seq
    replayed = by_alice.model_copy(update={"command_id": "replayed"})
    h.ports.log.send(replayed)  # alice's decision on the first pause, sent again
    h.run()
    assert "does not match" in _verdict(h, replayed)[1]  # type: ignore[operator]
    h.ports.log.send(_signed(bob, second, "bob", reject=True))
    h.run()
    state = h.state(run_id)
    assert state.status == "completed"
    assert WIRES == [100]  # one approver may reject: the second wire never ran


def test_a_gate_with_approvers_is_not_decided_ahead_of_time() -> None:
    early = Approve(run_id="r", by="alice", gate="wire")
    now = datetime.now(UTC)
    refused = judge(
        None, early, policy=FOUR_EYES, key=None, signature_ok=False, now=now
    )
    assert refused.refused is not None
    assert "not ahead of time" in refused.refused
    anyone = judge(
        None, early, policy=ApprovalPolicy(), key=None, signature_ok=False, now=now
    )
    assert anyone.refused is None


def test_an_approval_of_other_arguments_is_void() -> None:
    call_ = ToolCall(call_id="c1", name="wire", args_json='{"amount": 100}')
    state = RunState(run_id="r", agent="payer", status="running")
    state.open_tool_calls = [call_]
    approved: dict[str, JsonValue] = {"reason": "approved", "by": "bob", "seq": 5}
    state.gate_decisions["wire"] = {
        **approved,
        "args_hash": args_hash('{"amount":100}'),
    }
    assert isinstance(_agent().plan(state), CallTool)  # key order does not matter
    state.gate_decisions["wire"] = {**approved, "args_hash": args_hash('{"amount":1}')}
    step = _agent().plan(state)
    assert isinstance(step, Interrupt)
    assert step.reason == "awaiting_approval"


def _forge(h: AgentHarness, run_id: str, event: Event) -> None:
    """``event`` appended as a worker appends it -- chained on the run's head and
    carrying a valid writer MAC: what someone who holds the writer key can do."""
    log = h.ports.log
    head = log.read_sealed(run_id)[-1].digest
    log.append_sealed(log.seal([event], head))


def _next(h: AgentHarness, run_id: str) -> dict[str, Any]:
    state = h.state(run_id)
    return {"run_id": run_id, "seq": state.seq + 1, "step": state.step}


def test_a_forged_approval_at_a_signed_gate_runs_nothing(
    paused: tuple[AgentHarness, str, Keys],
) -> None:
    """The writer's MAC shows who appended an event, not who decided: a ``resumed``
    appended with the writer key but without valid signatures (none, a made-up
    one, or one a real approver made for another pause) is verified again before
    the approved call runs, and the run waits at the gate again."""
    h, run_id, keys = paused
    alice = keys.make("alice", "alice")
    bob = keys.make("bob", "bob", "finance")
    pause = pause_of(h.state(run_id))
    assert pause is not None
    expires = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=5)
    signed = {"key_id": alice.key_id, "expires_at": expires}
    forgeries: list[tuple[dict[str, Any], str]] = [
        ({}, "the decision carries none"),
        ({**signed, "signature": b"\x00" * 64}, "does not verify"),
        ({**signed, "key_id": "ed25519:unknown"}, "is not registered"),
    ]
    for extra, why in forgeries:
        WIRES.clear()
        now = pause_of(h.state(run_id))
        assert now is not None
        fields = {"signature": b"\x01" * 64, **extra} if extra else {}
        _forge(
            h,
            run_id,
            Resumed(
                **_next(h, run_id),
                reason="approved",
                by="alice",
                args_hash=now.args_hash,
                **fields,
            ),
        )
        h.run()
        assert WIRES == [], why
        state = h.state(run_id)
        assert state.status == "paused"
        assert state.waiting is not None
        assert state.waiting.gate == "wire"
        assert why in json.loads(state.waiting.detail_json)["void"]
    # The audit verifies the signatures the log keeps, as the worker did.
    report = audit(
        h.ports.log,
        h.ports.projections,
        h.ports.ledger,
        events_topic=h.settings.kafka.events_topic,
        partitions=h.ports.log.partition_count(),
        prices={},
        keyring=h.ports.keyring,
    )
    problems = report.runs[run_id].problems
    assert any("a signed approval" in p and "does not verify" in p for p in problems)
    assert any("a signed approval" in p and "not registered" in p for p in problems)
    # Two real signatures made for the first pause, replayed onto the one now.
    first = [_signed(alice, pause, "alice"), _signed(bob, pause, "bob")]
    now = pause_of(h.state(run_id))
    assert now is not None
    assert now.seq != pause.seq
    _forge(
        h,
        run_id,
        ApprovalRecorded(
            **_next(h, run_id),
            gate="wire",
            by="alice",
            command_id="f1",
            key_id=alice.key_id,
            args_hash=now.args_hash,
            signature=first[0].signature,
            expires_at=first[0].expires_at,
        ),
    )
    _forge(
        h,
        run_id,
        Resumed(
            **_next(h, run_id),
            reason="approved",
            by="bob",
            args_hash=now.args_hash,
            key_id=bob.key_id,
            signature=first[1].signature,
            expires_at=first[1].expires_at,
        ),
    )
    h.run()
    assert WIRES == []
    waiting = h.state(run_id).waiting
    assert waiting is not None
    assert "does not verify" in json.loads(waiting.detail_json)["void"]
    # The approvers decide the pause the run waits at now: the wire runs once.
    again = pause_of(h.state(run_id))
    assert again is not None
    h.ports.log.send(_signed(alice, again, "alice"))
    h.ports.log.send(_signed(bob, again, "bob"))
    h.run()
    assert WIRES == [100]


def test_a_dangling_call_of_a_signed_gate_needs_its_approval_to_verify(
    paused: tuple[AgentHarness, str, Keys],
) -> None:
    """A ``tool_call_requested`` forged with the writer key after an unsigned
    ``resumed``: reconciling it could call the tool, so the run waits for a
    person instead."""
    h, run_id, _ = paused
    now = pause_of(h.state(run_id))
    assert now is not None
    _forge(
        h,
        run_id,
        Resumed(
            **_next(h, run_id), reason="approved", by="alice", args_hash=now.args_hash
        ),
    )
    state = h.state(run_id)
    call_id = state.open_tool_calls[0].call_id
    _forge(
        h,
        run_id,
        ToolCallRequested(
            **{**_next(h, run_id), "step": state.step + 1},
            call_id=call_id,
            tool="wire",
            args_json='{"amount":100}',
            idempotency_key=f"{run_id}:{state.step + 1}",
        ),
    )
    h.run()
    assert WIRES == []
    waiting = h.state(run_id).waiting
    assert waiting is not None
    assert waiting.reason == "uncertain_effect"
    assert "carries none" in json.loads(waiting.detail_json)["why"]
