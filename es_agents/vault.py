"""Encryption at rest and crypto-shredding: a data key per run, wrapped by a master key.

An agent that opts in (``encrypted=True``) has the payload fields of its events --
completions, tool arguments and results, the run's input, provided input, its output
-- written as ``enc1:`` + base64(nonce + AES-256-GCM ciphertext), under a data key of
its own run (associated data: the run id). Data keys live in Postgres
(``run_keys``) wrapped by the master key (``ES_AGENTS_MASTER_KEY`` or
``ES_AGENTS_MASTER_KEY_FILE``); claim-checked objects hold the ciphertext, the
projector folds the ciphertext, so snapshots, transcripts and projections hold it
too, and only a process with the master key reads a payload back (``reveal``).

``es-agents forget RUN`` destroys the run's data key: its payloads are unreadable
everywhere at once, while its structure, hashes and status stay. A revealed value of
a forgotten run reads ``FORGOTTEN``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import threading
from collections.abc import Callable
from dataclasses import fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Protocol, TypeVar, final

from pydantic import BaseModel

from es_agents.core.events import (
    ChildReturned,
    Event,
    Interrupted,
    MessageReceived,
    ModelResponded,
    Resumed,
    RunCompleted,
    RunFailed,
    RunStarted,
    ToolCallRequested,
    ToolReturned,
)
from es_agents.core.step import canonical_json
from es_agents.core.transcript import Transcript
from es_agents.errors import ConfigError

PREFIX = "enc1:"
FORGOTTEN = "(forgotten)"
SEALED = "(encrypted)"  # what a process without the master key shows
NONCE = 12
X = TypeVar("X")

# The payload fields of each event type an encrypted agent writes encrypted.
FIELDS: dict[type[Event], tuple[str, ...]] = {
    RunStarted: ("input_json",),
    ModelResponded: ("content",),
    ToolCallRequested: ("args_json",),
    ToolReturned: ("result_json", "error"),  # a tool's message, a rejection's reason
    Resumed: ("input_json",),
    MessageReceived: ("text",),
    ChildReturned: ("output_json",),
    RunCompleted: ("output_json",),
    RunFailed: ("error",),  # a cancel's reason, a tool's or model's message
}


class Vault(Protocol):
    """Runs' data keys (wrapped at rest by the master key)."""

    def data_key(self, run_id: str, create: bool) -> bytes | None:
        """The run's data key (made when ``create`` and there is none); None when
        it has none, or was forgotten."""
        ...

    def forget(self, run_id: str) -> bool:
        """Destroy the run's data key; False when it had none."""
        ...

    def forgotten(self, run_id: str) -> bool: ...

    def forgotten_runs(self) -> set[str]: ...

    def rewrap(self, old: bytes) -> int:
        """Wrap the data keys wrapped by the ``old`` master key under the current
        one; how many."""
        ...


def load_master_key(value: str | None, path: str | None) -> bytes | None:
    """The 32-byte master key from base64 text or a file of it (None: not set)."""
    if value is None and path is not None:
        try:
            value = Path(path).read_text().strip()
        except OSError as e:
            raise ConfigError(f"cannot read the master key file {path}: {e}") from e
    if value is None:
        return None
    try:
        key = base64.b64decode(value, validate=True)
    except ValueError as e:
        raise ConfigError(f"the master key is not base64: {e}") from e
    if len(key) != 32:
        raise ConfigError(f"the master key must be 32 bytes, not {len(key)}")
    return key


def new_master_key() -> str:
    return base64.b64encode(os.urandom(32)).decode()


def master_key_id(master: bytes) -> str:
    return hashlib.sha256(b"es-agents master key" + master).hexdigest()[:16]


def wrap(master: bytes, run_id: str, data_key: bytes) -> bytes:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # noqa: PLC0415

    nonce = os.urandom(NONCE)
    return nonce + AESGCM(master).encrypt(nonce, data_key, run_id.encode())


def unwrap(master: bytes, run_id: str, wrapped: bytes) -> bytes:
    from cryptography.exceptions import InvalidTag  # noqa: PLC0415
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # noqa: PLC0415

    try:
        return AESGCM(master).decrypt(wrapped[:NONCE], wrapped[NONCE:], run_id.encode())
    except InvalidTag as e:
        raise ConfigError(
            f"run {run_id}'s data key does not open with this master key "
            "(another ES_AGENTS_MASTER_KEY?)"
        ) from e


@final
class MemoryVault:
    def __init__(self) -> None:
        self._keys: dict[str, bytes | None] = {}
        self._lock = threading.Lock()

    def data_key(self, run_id: str, create: bool) -> bytes | None:
        with self._lock:
            if run_id not in self._keys and create:
                self._keys[run_id] = os.urandom(32)
            return self._keys.get(run_id)

    def forget(self, run_id: str) -> bool:
        with self._lock:
            had = self._keys.get(run_id) is not None
            if run_id in self._keys:
                self._keys[run_id] = None
            return had

    def forgotten(self, run_id: str) -> bool:
        with self._lock:
            return run_id in self._keys and self._keys[run_id] is None

    def forgotten_runs(self) -> set[str]:
        with self._lock:
            return {run for run, key in self._keys.items() if key is None}

    def rewrap(self, old: bytes) -> int:
        return 0  # memory keys are not wrapped


@final
class Cipher:
    """Encrypts payload fields under their run's data key, and reveals them."""

    def __init__(self, vault: Vault) -> None:
        self.vault = vault
        self._cache: dict[str, bytes | None] = {}
        self._lock = threading.Lock()

    def _key(self, run_id: str, create: bool) -> bytes | None:
        with self._lock:
            if run_id in self._cache:
                return self._cache[run_id]
        key = self.vault.data_key(run_id, create)
        with self._lock:
            if key is not None:
                self._cache[run_id] = key
                while len(self._cache) > 10_000:
                    self._cache.pop(next(iter(self._cache)))
        return key

    def evict(self, run_id: str) -> None:
        with self._lock:
            self._cache.pop(run_id, None)

    # -- writing -----------------------------------------------------------------------
    def encrypt_text(self, run_id: str, text: str) -> str:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # noqa: PLC0415

        if text.startswith(PREFIX):
            return text
        key = self._key(run_id, create=True)
        if key is None:
            raise ConfigError(f"run {run_id} was forgotten: nothing is written for it")
        nonce = os.urandom(NONCE)
        sealed = nonce + AESGCM(key).encrypt(nonce, text.encode(), run_id.encode())
        return PREFIX + base64.b64encode(sealed).decode()

    def encrypt_event(self, event: Event) -> Event:
        """The event with its payload fields encrypted (already encrypted: kept)."""
        run = event.run_id
        update: dict[str, Any] = {}
        for name in FIELDS.get(type(event), ()):
            value = getattr(event, name)
            if isinstance(value, str) and value:
                update[name] = self.encrypt_text(run, value)
        if isinstance(event, ModelResponded) and event.tool_calls:
            update["tool_calls"] = tuple(
                c.model_copy(update={"args_json": self.encrypt_text(run, c.args_json)})
                for c in event.tool_calls
            )
        if isinstance(event, Interrupted) and '"args_json"' in event.detail_json:
            detail = json.loads(event.detail_json)
            if isinstance(detail, dict) and isinstance(detail.get("args_json"), str):
                detail["args_json"] = self.encrypt_text(run, detail["args_json"])
                update["detail_json"] = canonical_json(detail)
        return event.model_copy(update=update) if update else event

    # -- reading -----------------------------------------------------------------------
    def decrypt_text(self, run_id: str, text: str, strict: bool = True) -> str:
        """The plain text; ``FORGOTTEN`` when the run's key was destroyed. Without
        the master key: ``ConfigError``, or ``SEALED`` when not ``strict``."""
        from cryptography.exceptions import InvalidTag  # noqa: PLC0415
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # noqa: PLC0415

        try:
            key = self._key(run_id, create=False)
        except ConfigError:
            if strict:
                raise
            return SEALED
        if key is None:
            return FORGOTTEN
        sealed = base64.b64decode(text[len(PREFIX) :])
        try:
            plain = AESGCM(key).decrypt(sealed[:NONCE], sealed[NONCE:], run_id.encode())
        except InvalidTag as e:
            raise ConfigError(f"run {run_id}: a payload does not decrypt") from e
        return plain.decode()

    def reveal(self, run_id: str, value: X, strict: bool = False) -> X:
        """``value`` (an event, a command, a state, JSON) with every encrypted
        string of ``run_id`` decrypted, ``FORGOTTEN`` when its key is gone, and
        ``SEALED`` without the master key (``strict``: ``ConfigError``)."""
        revealed: X = _walk(value, lambda text: self.decrypt_text(run_id, text, strict))
        return revealed


def encrypts(agent: object) -> bool:
    """Whether an agent opted into encrypted payloads (``encrypted = True``)."""
    return bool(getattr(agent, "encrypted", False))


def encrypted(value: object) -> bool:
    """Whether ``value`` holds an encrypted string anywhere."""
    found = False

    def note(text: str) -> str:
        nonlocal found
        found = True
        return text

    _walk(value, note)
    return found


def _walk(value: Any, open_: Callable[[str], str]) -> Any:  # noqa: PLR0911 - per type
    if isinstance(value, str):
        if value.startswith(PREFIX):
            return open_(value)
        if PREFIX in value and value[:1] in "{[":  # JSON holding encrypted values
            try:
                parsed = json.loads(value)
            except ValueError:
                return value
            return canonical_json(_walk(parsed, open_))
        return value
    if isinstance(value, list):
        return [_walk(v, open_) for v in value]
    if isinstance(value, Transcript):  # stored messages: opened when read
        return value.mapped(lambda message: _walk(message, open_))
    if isinstance(value, tuple):
        return tuple(_walk(v, open_) for v in value)
    if isinstance(value, dict):
        return {k: _walk(v, open_) for k, v in value.items()}
    if isinstance(value, BaseModel):
        update = {
            name: _walk(getattr(value, name), open_)
            for name in type(value).model_fields
        }
        return value.model_copy(update=update)
    if is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: _walk(getattr(value, f.name), open_) for f in fields(value)}
        return replace(value, **changes)
    if isinstance(value, set):
        return value
    return value
