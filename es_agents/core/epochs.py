"""Fencing by epochs in the log: which records of an events partition count.

A worker that takes a partition takes its group's next epoch for the partition (a
counter in the read side) and appends a *claim*: a keyless, empty record whose
header ``es-claim`` holds ``EPOCH@GROUP``. Every event it appends afterwards carries
the same stamp in the header ``es-epoch``. A partition is one totally ordered
sequence, so the rule every reader applies is positional and needs no clock:

* a group's *floor* on the partition is the highest epoch it claimed so far;
* an event whose epoch is below its group's floor was written by a worker that had
  already lost the partition -- a zombie -- and is ignored, whatever the broker
  acknowledged;
* an event without an epoch was written without fencing (``ES_AGENTS_FENCING=none``,
  tools, imports) and counts.

A writer confirms each append by reading its partition past the append (ADR 0012): it
only reports an append durable once no higher claim lies before it, so an
acknowledged append is an accepted one, and a zombie learns it was fenced on its
first append after waking. Readers starting mid-partition start from an offset whose
floors they know (the projector stores it with its offsets) or at a counted record.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from es_agents.core.authorship import Authenticator

CLAIM_HEADER = "es-claim"
EPOCH_HEADER = "es-epoch"

Headers = Iterable[tuple[str, bytes]]
Floors = Mapping[str, int]  # per writer group: the highest epoch claimed


def _stamp(group: str, epoch: int) -> bytes:
    return f"{epoch}@{group}".encode()


def claim_headers(group: str, epoch: int) -> list[tuple[str, bytes]]:
    return [(CLAIM_HEADER, _stamp(group, epoch))]


def epoch_headers(group: str, epoch: int) -> list[tuple[str, bytes]]:
    return [(EPOCH_HEADER, _stamp(group, epoch))]


def _parse(value: bytes) -> tuple[str, int] | None:
    epoch, at, group = value.decode(errors="replace").partition("@")
    if not at or not epoch.isdigit():
        return None
    return group, int(epoch)


def _find(headers: Headers, name: str) -> tuple[str, int] | None:
    for key, value in headers:
        if key == name:
            return _parse(value)
    return None


def claimed(headers: Headers) -> tuple[str, int] | None:
    """(group, epoch) a claim record claims; None for any other record."""
    return _find(headers, CLAIM_HEADER)


def written_in(headers: Headers) -> tuple[str, int] | None:
    """(group, epoch) an event was written in; None when written without fencing."""
    return _find(headers, EPOCH_HEADER)


class EpochFence:
    """The floors of one partition, advanced record by record in partition order.

    Each agent's workers are their own consumer group, so several groups write to
    one events partition at once: floors, claims and fencing are per group.

    With an ``Authenticator``, a record without a valid writer MAC (``core.
    authorship``) counts as nothing: a claim does not raise a floor, an event is
    left out and counted in ``forged``.
    """

    __slots__ = ("auth", "floors", "forged", "ignored")

    def __init__(
        self, floors: Floors | None = None, auth: Authenticator | None = None
    ) -> None:
        self.floors: dict[str, int] = dict(floors or {})
        self.ignored = 0  # events refused so far (zombie writes)
        self.forged = 0  # records refused so far (no valid writer MAC)
        self.auth = auth

    def admits(self, headers: Headers, value: bytes = b"") -> bool:
        """Whether the record is an event that counts. A claim raises its group's
        floor and is not an event; an event below its group's floor is ignored and
        counted; without a valid MAC (when authenticating) neither counts."""
        headers = list(headers) if headers else []
        auth = self.auth
        raw_claim = _raw(headers, CLAIM_HEADER)
        if raw_claim is not None:
            claim = _parse(raw_claim)
            if auth is not None and not auth.verifies_claim(headers, raw_claim):
                self.forged += 1
                return False
            if claim is not None:
                group, epoch = claim
                self.floors[group] = max(self.floors.get(group, 0), epoch)
            return False
        if auth is not None and not auth.verifies(headers, value):
            self.forged += 1
            return False
        stamp = written_in(headers)
        if stamp is None:
            return True
        group, epoch = stamp
        floor = self.floors.get(group, 0)
        if epoch < floor:
            self.ignored += 1
            return False
        # An event of a higher epoch than any claim seen: its writer's claim lies
        # before where this reading started (a reading starting at a counted record).
        self.floors[group] = epoch
        return True


def _raw(headers: Headers, name: str) -> bytes | None:
    for key, value in headers:
        if key == name:
            return value
    return None


# The floors a read of an events partition starts from: a mapping (copied), or the
# fence an earlier read of the partition left where this one starts (carried on and
# advanced by this read: a reader that follows a partition read after read must
# carry it, or a zombie write after a claim it read earlier would count).
StartFloors = Floors | EpochFence
