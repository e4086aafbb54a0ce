"""The claim check: payload fields over a threshold go to an object store.

A completion's content, a tool call's arguments, a tool's result, a run's input or a
person's input larger than ``threshold`` bytes is stored by its SHA-256
(``sha256/<hex>``) and the event carries a ``PayloadClaim`` (field, hash, size, key)
with the field left empty. Commands do the same with their inputs (a start's, a
provided one): the client stores them, the worker reads them back before it applies
the command.
Every reader restores the field before folding, and checks the hash: a missing or
altered object raises ``PayloadUnavailable`` naming run, step and key — never a
silent wrong state.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, TypeVar

from es_agents.core.commands import Command, ProvideInput, StartRun
from es_agents.core.events import (
    ChildReturned,
    Event,
    MessageReceived,
    ModelResponded,
    PayloadClaim,
    Resumed,
    RunCompleted,
    RunStarted,
    ToolCall,
    ToolCallRequested,
    ToolReturned,
)
from es_agents.errors import ConfigError, PayloadUnavailable

DEFAULT_THRESHOLD = 256 * 1024
# The payload fields of each event type that may be claim-checked.
FIELDS: dict[type[Event], tuple[str, ...]] = {
    RunStarted: ("input_json",),
    ModelResponded: ("content",),
    ToolCallRequested: ("args_json",),
    ToolReturned: ("result_json",),
    Resumed: ("input_json",),
    MessageReceived: ("text",),
    ChildReturned: ("output_json",),
    RunCompleted: ("output_json",),
}
# The payload field of each command that may be claim-checked.
COMMAND_FIELDS: dict[type[Command], str] = {
    StartRun: "input_json",
    ProvideInput: "input_json",
}
C = TypeVar("C", bound=Command)


class BlobStore(Protocol):
    """Content-addressed bytes for payloads too large for an event (claim check)."""

    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key``; storing the same key again is harmless."""
        ...

    def get(self, key: str) -> bytes:
        """The bytes under ``key``; raise ``PayloadUnavailable`` when missing."""
        ...

    def delete(self, key: str) -> None:
        """Remove the object under ``key``; a missing one is no error."""
        ...

    def written_at(self, key: str) -> datetime | None:
        """When the object under ``key`` was last written (None: no such object)."""
        ...


@dataclass(frozen=True)
class ClaimCheck:
    store: BlobStore
    threshold: int = DEFAULT_THRESHOLD

    def __post_init__(self) -> None:
        if self.threshold < 1024:
            raise ConfigError("the payload threshold must be at least 1024 bytes")

    def large(self, event: Event) -> bool:
        """Whether ``claim`` may store any of the event's payloads away (a cheap
        check on lengths, so that small events skip the object store's thread)."""
        fields = FIELDS.get(type(event))
        if fields is None:
            return False
        most = self.threshold // 4  # characters of at most 4 UTF-8 bytes each
        for name in fields:
            value = getattr(event, name)
            if isinstance(value, str) and len(value) > most:
                return True
        if isinstance(event, ModelResponded):
            return any(len(c.args_json) > most for c in event.tool_calls)
        return False

    def claim(self, event: Event) -> Event:
        """The event with its large payload fields stored away (or as it is)."""
        fields = FIELDS.get(type(event))
        if fields is None:
            return event
        update: dict[str, Any] = {}
        claims: list[PayloadClaim] = []
        for name in fields:
            value = getattr(event, name)
            if isinstance(value, str) and len(value) * 4 > self.threshold:
                data = value.encode()
                if len(data) > self.threshold:
                    claims.append(self._put(name, data))
                    update[name] = ""
        if isinstance(event, ModelResponded):
            calls = list(event.tool_calls)
            for i, call in enumerate(calls):
                data = call.args_json.encode()
                if len(data) > self.threshold:
                    claims.append(self._put(f"tool_calls.{i}.args_json", data))
                    calls[i] = call.model_copy(update={"args_json": ""})
            if claims:
                update["tool_calls"] = tuple(calls)
        if not claims:
            return event
        return event.model_copy(update={**update, "claims": tuple(claims)})

    def claim_command(self, command: C) -> C:
        """The command with its input stored away when it is over the threshold."""
        name = COMMAND_FIELDS.get(type(command))
        if name is None:
            return command
        data = str(getattr(command, name)).encode()
        if len(data) <= self.threshold:
            return command
        claim = self._put(name, data)
        return command.model_copy(update={name: "", "claims": (claim,)})

    def restore_command(self, command: C) -> C:
        """The command with its claimed input read back and checked."""
        claims: tuple[PayloadClaim, ...] = getattr(command, "claims", ())
        if not claims:
            return command
        update: dict[str, Any] = {"claims": ()}
        for claim in claims:
            update[claim.field] = self._get(command.run_id, 0, claim)
        return command.model_copy(update=update)

    def _put(self, name: str, data: bytes) -> PayloadClaim:
        digest = hashlib.sha256(data).hexdigest()
        key = f"sha256/{digest}"
        self.store.put(key, data)
        return PayloadClaim(field=name, sha256=digest, size=len(data), key=key)

    def restore(self, event: Event) -> Event:
        """The event with its claimed fields read back and checked."""
        claims: tuple[PayloadClaim, ...] = getattr(event, "claims", ())
        if not claims:
            return event
        update: dict[str, Any] = {"claims": ()}
        calls = list(getattr(event, "tool_calls", ()))
        for claim in claims:
            text = self._get(event.run_id, event.step, claim)
            if claim.field.startswith("tool_calls."):
                index = int(claim.field.split(".")[1])
                call: ToolCall = calls[index]
                calls[index] = call.model_copy(update={"args_json": text})
                update["tool_calls"] = tuple(calls)
            else:
                update[claim.field] = text
        return event.model_copy(update=update)

    def _get(self, run_id: str, step: int, claim: PayloadClaim) -> str:
        where = f"run {run_id}, step {step}, key {claim.key}"
        try:
            data = self.store.get(claim.key)
        except PayloadUnavailable as e:
            raise PayloadUnavailable(
                f"payload of {claim.field} ({where}) is unavailable: {e}",
                run_id,
                step,
                claim.key,
            ) from e
        if len(data) != claim.size or hashlib.sha256(data).hexdigest() != claim.sha256:
            raise PayloadUnavailable(
                f"payload of {claim.field} ({where}) does not match its hash",
                run_id,
                step,
                claim.key,
            )
        return data.decode()


def restorer(checks: ClaimCheck | None) -> Any:
    """``restore`` of a claim check, or the identity when there is none."""
    return checks.restore if checks is not None else (lambda event: event)
