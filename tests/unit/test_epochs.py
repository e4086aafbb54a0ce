"""The epoch rule every reader of an events partition applies (pure)."""

from __future__ import annotations

from es_agents.core.epochs import (
    EpochFence,
    claim_headers,
    claimed,
    epoch_headers,
    written_in,
)


def test_stamps_round_trip() -> None:
    assert claimed(claim_headers("es.workers.a", 7)) == ("es.workers.a", 7)
    assert written_in(epoch_headers("g@x", 3)) == ("g@x", 3)  # '@' in a group name
    assert claimed(epoch_headers("g", 3)) is None
    assert written_in([("es-epoch", b"not-a-number@g")]) is None


def test_writes_below_their_groups_claim_are_left_out() -> None:
    fence = EpochFence()
    assert fence.admits(epoch_headers("a", 1))
    assert not fence.admits(claim_headers("a", 2))  # a claim is not an event
    assert not fence.admits(epoch_headers("a", 1))  # the zombie, after the claim
    assert fence.admits(epoch_headers("b", 1))  # another agent's group: its own floor
    assert fence.admits(epoch_headers("a", 2))
    assert fence.admits([])  # written without fencing
    assert fence.ignored == 1
    assert fence.floors == {"a": 2, "b": 1}


def test_a_late_stale_claim_does_not_lower_the_floor() -> None:
    fence = EpochFence()
    fence.admits(claim_headers("a", 6))
    fence.admits(claim_headers("a", 5))  # took its epoch first, claimed last
    assert not fence.admits(epoch_headers("a", 5))
    assert fence.floors == {"a": 6}


def test_a_reading_from_stored_floors_or_a_counted_event() -> None:
    stored = EpochFence({"a": 4})
    assert not stored.admits(epoch_headers("a", 3))
    # Started at a counted event of epoch 4, without floors: its epoch is the floor.
    fresh = EpochFence()
    assert fresh.admits(epoch_headers("a", 4))
    assert not fresh.admits(epoch_headers("a", 3))
