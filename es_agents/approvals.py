"""Signed approvals: approvers' keys, signing a decision, and the worker's check.

The rules (who may decide, quorum, expiry, replay) are pure, in
``es_agents.core.approvals``; this module adds Ed25519 (the ``cryptography``
package): making a key pair, signing a decision for the pause a run is in, and
verifying it against the public key registered for the approver (``Keyring``: the
``approver_keys`` table, or memory in tests).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol, final

from es_agents.core.approvals import (
    ApprovalPolicy,
    ApproverKey,
    Pause,
    Verdict,
    answered,
    decision_of,
    escalated,
    judge,
    pause_of,
    signed_payload,
    unproven,
)
from es_agents.core.commands import Approve, Reject
from es_agents.core.events import ApprovalRecorded, DecisionRefused, Event
from es_agents.core.state import RunState
from es_agents.errors import ConfigError


class Keyring(Protocol):
    """Approvers' public keys by key id."""

    def get(self, key_id: str) -> ApproverKey | None: ...

    def add(self, key: ApproverKey) -> None: ...

    def revoke(self, key_id: str) -> bool: ...

    def all(self) -> list[ApproverKey]: ...


@final
class MemoryKeyring:
    def __init__(self) -> None:
        self._keys: dict[str, ApproverKey] = {}
        self._lock = threading.Lock()

    def get(self, key_id: str) -> ApproverKey | None:
        with self._lock:
            return self._keys.get(key_id)

    def add(self, key: ApproverKey) -> None:
        with self._lock:
            if key.key_id in self._keys:
                raise ConfigError(f"key {key.key_id} is already registered")
            self._keys[key.key_id] = key

    def revoke(self, key_id: str) -> bool:
        with self._lock:
            key = self._keys.get(key_id)
            if key is None:
                return False
            self._keys[key_id] = replace(key, revoked=True)
            return True

    def all(self) -> list[ApproverKey]:
        with self._lock:
            return sorted(self._keys.values(), key=lambda k: k.key_id)


def key_id_of(public_key: bytes) -> str:
    return "ed25519:" + hashlib.sha256(public_key).hexdigest()[:16]


def new_key(identity: str, roles: frozenset[str]) -> tuple[bytes, ApproverKey]:
    """A new key pair: (the private key as PEM, the public key to register)."""
    from cryptography.hazmat.primitives import serialization  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (  # noqa: PLC0415
        Ed25519PrivateKey,
    )

    private = Ed25519PrivateKey.generate()
    public = private.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return pem, ApproverKey(key_id_of(public), identity, frozenset(roles), public)


@dataclass(frozen=True)
class SigningKey:
    """An approver's private key, loaded from its PEM file."""

    key_id: str
    private: Any  # Ed25519PrivateKey

    @classmethod
    def load(cls, pem: bytes) -> SigningKey:
        from cryptography.hazmat.primitives import serialization  # noqa: PLC0415
        from cryptography.hazmat.primitives.asymmetric.ed25519 import (  # noqa: PLC0415
            Ed25519PrivateKey,
        )

        try:
            private = serialization.load_pem_private_key(pem, password=None)
        except (ValueError, TypeError) as e:
            raise ConfigError(f"not an Ed25519 private key in PEM: {e}") from e
        if not isinstance(private, Ed25519PrivateKey):
            raise ConfigError("the key is not an Ed25519 private key")
        public = private.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        return cls(key_id_of(public), private)

    @classmethod
    def from_file(cls, path: Path) -> SigningKey:
        try:
            return cls.load(path.read_bytes())
        except OSError as e:
            raise ConfigError(f"cannot read the key file {path}: {e}") from e

    def sign(
        self, pause: Pause, decision: str, by: str, valid_for: timedelta
    ) -> tuple[bytes, datetime]:
        """(signature, expiry) of ``decision`` by ``by`` on ``pause``."""
        expires = (datetime.now(UTC) + valid_for).replace(microsecond=0)
        payload = signed_payload(pause, decision, by, self.key_id, expires)
        return bytes(self.private.sign(payload)), expires


def verify(public_key: bytes, payload: bytes, signature: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (  # noqa: PLC0415
        Ed25519PublicKey,
    )

    try:
        Ed25519PublicKey.from_public_bytes(public_key).verify(signature, payload)
    except (InvalidSignature, ValueError):
        return False
    return True


@dataclass(frozen=True)
class Judged:
    """What a decision on a gate with a policy does: events to add (types and
    fields), and a refusal's reason or a note for the sender."""

    events: list[tuple[type[Event], dict[str, object]]]
    refused: str | None = None
    note: str | None = None


@final
class Approvals:
    """A worker's check of decisions on its agent's gates that have a policy."""

    def __init__(
        self,
        policies: Mapping[str, ApprovalPolicy],
        keyring: Keyring,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        escalations: Mapping[str, ApprovalPolicy] | None = None,
    ) -> None:
        self.policies = dict(policies)
        self.keyring = keyring
        self.clock = clock
        self.escalations = dict(escalations or {})  # who decides past a deadline

    def policy_for(
        self, state: RunState, command: Approve | Reject
    ) -> ApprovalPolicy | None:
        pause = pause_of(state)
        gate = command.gate or (pause.gate if pause is not None else None)
        if gate is None:
            return None
        if gate in self.escalations and escalated(state, gate):
            return self.escalations[gate]
        return self.policies.get(gate)

    def judge(self, state: RunState, command: Approve | Reject) -> Judged | None:
        """The events a decision on a gate with a policy adds to the run: a
        refusal's record, or an approval counted towards the quorum (none for the
        one that completes it: ``decide`` resumes the run). None: no policy."""
        policy = self.policy_for(state, command)
        if policy is None:
            return None
        verdict = self.check(state, command, policy)
        pause = pause_of(state)
        gate = command.gate or (pause.gate if pause is not None else None)
        if verdict.refused is not None:
            refusal: dict[str, object] = {
                "gate": gate,
                "decision": decision_of(command),
                "by": command.by,
                "command_id": command.command_id,
                "key_id": command.key_id,
                "reason": verdict.refused,
            }
            return Judged([(DecisionRefused, refusal)], refused=verdict.refused)
        if verdict.complete:
            return Judged([])
        recorded: dict[str, object] = {
            "gate": gate,
            "by": command.by,
            "command_id": command.command_id,
            "key_id": command.key_id,
            "args_hash": pause.args_hash if pause is not None else None,
            "signature": command.signature,
            "expires_at": command.expires_at,
        }
        count = len(pause.approvals) + 1 if pause is not None else 1
        return Judged(
            [(ApprovalRecorded, recorded)],
            note=f"approval {count} of {policy.quorum} recorded; "
            "the run waits for the others",
        )

    def unproven(self, state: RunState, gate: str) -> str | None:
        """Why the approval the run holds for ``gate`` does not prove itself from
        the log (a gate whose policy wants signed decisions), or None: verified
        again before the approved call runs, whoever appended it."""
        policy = self.policies.get(gate)
        if gate in self.escalations and escalated(state, gate):
            policy = self.escalations[gate]
        decided = state.gate_decisions.get(gate)
        if policy is None or decided is None:
            return None
        return unproven(
            state.run_id,
            gate,
            decided,
            policy,
            key_of=self.keyring.get,
            verifies=verify,
        )

    def check(
        self, state: RunState, command: Approve | Reject, policy: ApprovalPolicy
    ) -> Verdict:
        pause = pause_of(state)
        key = None
        signature_ok = False
        if command.signature is not None and command.key_id is not None:
            key = self.keyring.get(command.key_id)
            if key is not None and pause is not None and command.expires_at is not None:
                payload = signed_payload(
                    answered(pause, command),
                    decision_of(command),
                    command.by,
                    command.key_id,
                    command.expires_at,
                )
                signature_ok = verify(key.public_key, payload, command.signature)
        return judge(
            pause,
            command,
            policy=policy,
            key=key,
            signature_ok=signature_ok,
            now=self.clock(),
        )


def policies_of(agent: object) -> dict[str, ApprovalPolicy]:
    """An agent's approval policies by gate (``approval_policies``), if any."""
    found = getattr(agent, "approval_policies", None)
    if found is None:
        return {}
    policies = dict(found)
    for gate, policy in policies.items():
        if not isinstance(policy, ApprovalPolicy):
            raise ConfigError(f"gate {gate!r}: the policy is not an ApprovalPolicy")
    return policies
