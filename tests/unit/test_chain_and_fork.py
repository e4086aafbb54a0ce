"""The hash chain (``core.chain``) and forks (``core.fork``), pure."""

from __future__ import annotations

import itertools

import pytest

from es_agents.codec import AvroCodec, SchemaCatalog
from es_agents.core.chain import GENESIS, ChainCheck, Sealed, digest, seal, verify
from es_agents.core.commands import ForkRun
from es_agents.core.events import Forked, StatePatched, ToolCallRequested
from es_agents.core.fold import replay
from es_agents.core.fork import fork_events
from es_agents.core.step import Refused
from es_agents.lab.demo import script

CODEC = AvroCodec()


def _sealed(run_id: str = "r1", steps: int = 2) -> list[Sealed]:
    return seal(script(run_id, steps=steps), CODEC.encode, GENESIS)


def test_a_sealed_run_verifies_and_each_event_names_its_predecessor() -> None:
    sealed = _sealed()
    assert sealed[0].event.prev == GENESIS
    for before, after in itertools.pairwise(sealed):
        assert after.event.prev == digest(before.value)
    assert verify("r1", [(s.event, s.value) for s in sealed]) == []


def test_sealing_in_batches_chains_on() -> None:
    events = script("r1", steps=2)
    first = seal(events[:3], CODEC.encode, GENESIS)
    rest = seal(events[3:], CODEC.encode, first[-1].digest)
    whole = seal(events, CODEC.encode, GENESIS)
    assert [s.event.prev for s in first + rest] == [s.event.prev for s in whole]


@pytest.mark.parametrize("case", ["altered", "dropped", "swapped", "spliced"])
def test_each_tampering_breaks_the_chain(case: str) -> None:
    sealed = _sealed()
    items = [(s.event, s.value) for s in sealed]
    if case == "altered":  # a re-encoded edit, prev kept: the next link breaks
        event = sealed[3].event
        edited = event.model_copy(update={"step": event.step + 1})
        items[3] = (edited, CODEC.encode(edited))
        where = 4
    elif case == "dropped":
        del items[3]
        where = 4
    elif case == "swapped":
        items[3], items[4] = items[4], items[3]
        where = 4
    else:
        other = _sealed("r2")
        items.insert(3, (other[3].event, other[3].value))
        where = 3
    breaks = verify("r1", items)
    assert breaks, case
    assert breaks[0].startswith(f"seq {where}:"), breaks


def test_the_chain_holds_across_schema_versions() -> None:
    """An event written under an older schema is hashed as it was written."""
    catalog = SchemaCatalog.load()
    old = catalog.versions("state_patched")[0]
    event = StatePatched(run_id="r1", seq=0, step=0, key="k", value_json="1")
    record = {k: v for k, v in event.model_dump().items() if k != "prev"}
    written = CODEC.encode_with_schema(old, record)
    back = CODEC.decode_event(written)
    assert back.prev == b""  # the field did not exist: its default
    check = ChainCheck("r1")
    assert check.add(back, written) is None
    assert check.head == digest(written) != digest(CODEC.encode(back))


def _command(at: int, run_id: str = "fork-1") -> ForkRun:
    return ForkRun(run_id=run_id, agent="research", origin_run="r1", at_seq=at)


def test_a_fork_copies_the_prefix_under_its_own_id_and_keys() -> None:
    sealed = _sealed(steps=2)
    origin = [s.event for s in sealed]
    call = next(e for e in origin if isinstance(e, ToolCallRequested))
    at = call.seq + 1  # the tool returned: its result is part of the prefix
    events, state = fork_events(origin, _command(at), sealed[at].digest)
    copies, forked = events[:-1], events[-1]
    assert [e.seq for e in copies] == list(range(at + 1))
    assert all(e.run_id == "fork-1" for e in events)
    assert not {e.event_id for e in copies} & {e.event_id for e in origin}
    copied_call = next(e for e in copies if isinstance(e, ToolCallRequested))
    assert copied_call.idempotency_key == "fork-1:" + call.idempotency_key.split(":")[1]
    assert isinstance(forked, Forked)
    assert (forked.origin_run, forked.origin_seq) == ("r1", at)
    assert forked.origin_head == sealed[at].digest
    # Recorded completions kept: the fork's fold has the origin's transcript.
    before = replay(origin[: at + 1])
    assert state.transcript == before.transcript
    assert state.model_calls == before.model_calls
    assert (state.origin_run, state.origin_seq) == ("r1", at)
    assert state.seq == at + 1
    assert replay(events) == state


@pytest.mark.parametrize(
    ("at", "reason"),
    [(999, "has no seq 999"), (-1, None)],
)
def test_a_fork_is_refused_where_the_origin_has_no_such_seq(
    at: int, reason: str | None
) -> None:
    origin = [s.event for s in _sealed()]
    if at < 0:
        with pytest.raises(ValueError, match="greater than or equal to 0"):
            _command(at)
        return
    with pytest.raises(Refused, match=reason):
        fork_events(origin, _command(at), b"")


def test_a_fork_at_the_runs_end_is_refused() -> None:
    origin = [s.event for s in _sealed()]
    with pytest.raises(Refused, match="completed at seq"):
        fork_events(origin, _command(origin[-1].seq), b"")
    with pytest.raises(Refused, match="unknown run"):
        fork_events([], _command(0), b"")
