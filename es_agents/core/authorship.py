"""Authorship: which records of an events partition were written by a worker.

The hash chain (``core.chain``) shows order, not authorship: anyone who may produce
to the events topic can compute the next ``prev``. So every record a worker writes
carries, in the header ``es-auth``, ``KEY_ID:MAC`` -- an HMAC-SHA256 under a *writer
key* that workers and projectors hold and clients and topic producers do not:

* an event's MAC covers its bytes as written (schema header and Avro body, so its
  run, seq, step, ``prev`` and payload);
* a claim's MAC covers its claim stamp (``EPOCH@GROUP``), so nobody else can fence
  a worker out of its partition.

Every reader that acts on the log (the worker's load and its read-back, the
projector, replay, audit) leaves out a record whose MAC is missing or wrong and
reports it, as it does a fenced worker's write. Keys have ids, so a new key can be
added and old records still verify; the newest key signs.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable, Mapping

AUTH_HEADER = "es-auth"
KEY_BYTES = 32

Headers = Iterable[tuple[str, bytes]]


class Authenticator:
    """Signs records with the newest writer key and verifies them with any."""

    __slots__ = ("_keys", "_signing", "_signing_id")

    def __init__(self, keys: Mapping[str, bytes], signing: str) -> None:
        if signing not in keys:
            raise ValueError(f"no writer key {signing!r}")
        for key_id, key in keys.items():
            if ":" in key_id or len(key) < 16:
                raise ValueError(
                    f"writer key {key_id!r}: an id without ':' and 16+ bytes"
                )
        self._keys = {k.encode(): v for k, v in keys.items()}
        self._signing_id = signing.encode()
        self._signing = keys[signing]

    @property
    def key_id(self) -> str:
        return self._signing_id.decode()

    def header(self, value: bytes) -> tuple[str, bytes]:
        """The ``es-auth`` header of a record whose signed bytes are ``value``."""
        mac = hmac.new(self._signing, value, hashlib.sha256).hexdigest().encode()
        return (AUTH_HEADER, self._signing_id + b":" + mac)

    def claim_header(self, stamp: bytes) -> tuple[str, bytes]:
        return self.header(b"claim:" + stamp)

    def verifies(self, headers: Headers, value: bytes) -> bool:
        """Whether ``headers`` hold a valid MAC of ``value`` under a known key."""
        for name, given in headers:
            if name == AUTH_HEADER:
                key_id, _, mac = given.partition(b":")
                key = self._keys.get(key_id)
                if key is None:
                    return False
                expected = hmac.new(key, value, hashlib.sha256).hexdigest().encode()
                return hmac.compare_digest(expected, mac)
        return False

    def verifies_claim(self, headers: Headers, stamp: bytes) -> bool:
        return self.verifies(headers, b"claim:" + stamp)


def snapshot_bytes(run_id: str, seq: int, head: bytes, state: object) -> bytes:
    """What a snapshot's MAC covers: the run, the seq, the digest of the event it
    was taken at (its place in the chain) and the state in a canonical JSON form
    (the keys sorted: a JSON column gives them back in its own order)."""
    body = json.dumps(state, sort_keys=True, separators=(",", ":"), default=str)
    return f"snapshot:{run_id}:{seq}:".encode() + head + b":" + body.encode()


def chunk_bytes(run_id: str, chunk: int, messages: object) -> bytes:
    """What a transcript chunk's MAC covers: the run, the chunk's number and its
    messages in the canonical JSON form of ``snapshot_bytes``. The number binds it to
    its place; a chunk only grows, so a signed chunk of the expected length is the
    run's own."""
    body = json.dumps(messages, sort_keys=True, separators=(",", ":"), default=str)
    return f"transcript:{run_id}:{chunk}:".encode() + body.encode()


def mac_of(header: tuple[str, bytes]) -> str:
    """An ``es-auth`` header's value, as a text column keeps it."""
    return header[1].decode()


def worth_a_line(count: int) -> bool:
    """Whether the ``count``-th record left out gets a log line: the first ten,
    then every thousandth (a flood of forged records without a flood of lines)."""
    return count <= 10 or count % 1000 == 0


def describe(headers: Headers) -> str:
    """What a record's ``es-auth`` header says, for a report."""
    for name, given in headers:
        if name == AUTH_HEADER:
            key_id = given.partition(b":")[0].decode(errors="replace")
            return f"a MAC under key {key_id!r} that does not verify"
    return "no writer MAC"
