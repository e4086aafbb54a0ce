"""Tamper evidence: a hash chain through each run's events.

Every event names in ``prev`` the SHA-256 of its run's previous event *as written*
(the record's bytes: schema header and Avro body); ``run_started`` names nothing.
So, reading a run's log:

* an altered byte changes that event's digest, and the next event no longer names it;
* a dropped event, a swapped pair or a foreign event spliced in leaves an event whose
  ``prev`` is not the digest of the event before it;
* the last event, which nothing names yet, is covered by the run's *head* (the digest
  of its bytes), which the projector keeps in ``runs.head``: a second witness that a
  rewrite of the log's tail would have to forge as well.

Hashing the bytes as written, never a re-encoding, keeps the chain valid across
schema versions: an event written under an older schema is hashed as it was written.
A claim-checked payload is covered by its reference and its content hash, both part
of the event's bytes (``PayloadClaim``); reading it back checks the payload's hash.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, MutableMapping
from dataclasses import dataclass

from es_agents.core.events import Event

GENESIS = b""  # the ``prev`` of run_started


def digest(value: bytes) -> bytes:
    return hashlib.sha256(value).digest()


@dataclass(frozen=True, slots=True)
class Sealed:
    """An event with ``prev`` set, and the bytes it is written as."""

    event: Event
    value: bytes
    # Record headers beside the bytes (trace context); not part of the digest.
    headers: tuple[tuple[str, bytes], ...] = ()

    @property
    def digest(self) -> bytes:
        return digest(self.value)


def seal(
    events: Iterable[Event], encode: Callable[[Event], bytes], head: bytes
) -> list[Sealed]:
    """One run's events, in order, chained after the event whose digest is
    ``head`` (``GENESIS`` before run_started)."""
    out: list[Sealed] = []
    for given in events:
        event = given if given.prev == head else given.model_copy(update={"prev": head})
        value = encode(event)
        out.append(Sealed(event, value))
        head = digest(value)
    return out


def seal_runs(
    events: Iterable[Event],
    encode: Callable[[Event], bytes],
    heads: MutableMapping[str, bytes],
) -> list[Sealed]:
    """Events of many runs, each chained after its run's head in ``heads`` (updated).
    A run not in ``heads`` starts at ``run_started``; an event of a run whose head is
    unknown keeps the ``prev`` it has."""
    out: list[Sealed] = []
    for given in events:
        event = given
        head = heads.get(event.run_id)
        if head is None and event.seq == 0:
            head = GENESIS
        if head is not None and event.prev != head:
            event = event.model_copy(update={"prev": head})
        value = encode(event)
        out.append(Sealed(event, value))
        heads[event.run_id] = digest(value)
    return out


class ChainCheck:
    """Follows one run's events in log order; ``add`` says what breaks the chain."""

    def __init__(self, run_id: str, keep_heads: bool = False) -> None:
        self.run_id = run_id
        self.head = GENESIS
        self.keep_heads = keep_heads
        self.heads: dict[int, bytes] = {}  # seq -> digest of the event at seq
        self.breaks = 0

    def add(self, event: Event, value: bytes) -> str | None:
        found: str | None = None
        if event.run_id != self.run_id:
            found = (
                f"seq {event.seq}: an event of run {event.run_id} in this run's log "
                "(spliced in)"
            )
        elif event.prev != self.head:
            named = event.prev.hex()[:12] or "nothing"
            before = self.head.hex()[:12] or "nothing (no event before it)"
            found = (
                f"seq {event.seq}: hash chain broken: it names {named}..., the event "
                f"read before it hashes to {before}: an event altered, dropped, "
                "reordered or spliced in"
            )
        self.head = digest(value)
        if self.keep_heads:
            self.heads[event.seq] = self.head
        self.breaks += found is not None
        return found


def verify(run_id: str, items: Iterable[tuple[Event, bytes]]) -> list[str]:
    """Every break of ``run_id``'s chain, reading ``(event, bytes)`` in log order."""
    check = ChainCheck(run_id)
    return [p for event, value in items if (p := check.add(event, value)) is not None]
