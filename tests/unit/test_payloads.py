"""The claim check on an in-memory store: large fields leave the event, come back
whole and hash-checked; a missing or altered object names run, step and key."""

from __future__ import annotations

import pytest

from es_agents.adapters.memory import InMemoryBlobStore
from es_agents.codec import AvroCodec
from es_agents.core.commands import ProvideInput, StartRun
from es_agents.core.events import (
    ModelResponded,
    RunStarted,
    StatePatched,
    ToolCall,
    ToolReturned,
)
from es_agents.errors import ConfigError, PayloadUnavailable
from es_agents.payloads import ClaimCheck

BIG = "x" * 300_000


def _returned(result: str) -> ToolReturned:
    return ToolReturned(run_id="r1", seq=5, step=3, call_id="c1", result_json=result)


def test_large_fields_leave_the_event_and_come_back() -> None:
    store = InMemoryBlobStore()
    check = ClaimCheck(store, threshold=256 * 1024)
    event = _returned(BIG)
    claimed = check.claim(event)
    assert isinstance(claimed, ToolReturned)
    assert claimed.result_json == ""
    [claim] = claimed.claims
    assert (claim.field, claim.size) == ("result_json", 300_000)
    assert claim.key == f"sha256/{claim.sha256}"
    assert len(AvroCodec().encode(claimed)) < 1_000  # the log keeps a reference
    assert check.restore(AvroCodec().decode_event(AvroCodec().encode(claimed))) == event


def test_completion_content_and_tool_arguments_are_claimed() -> None:
    check = ClaimCheck(InMemoryBlobStore(), threshold=1024)
    event = ModelResponded(
        run_id="r1",
        seq=2,
        step=1,
        content="c" * 5000,
        tool_calls=(
            ToolCall(call_id="a", name="t", args_json='{"v": "' + "a" * 4000 + '"}'),
            ToolCall(call_id="b", name="t", args_json="{}"),
        ),
    )
    claimed = check.claim(event)
    assert isinstance(claimed, ModelResponded)
    assert [c.field for c in claimed.claims] == ["content", "tool_calls.0.args_json"]
    assert claimed.tool_calls[1].args_json == "{}"
    assert check.restore(claimed) == event


def test_small_events_and_other_types_are_left_alone() -> None:
    check = ClaimCheck(InMemoryBlobStore())
    small = _returned('{"ok": true}')
    assert check.claim(small) is small
    patch = StatePatched(run_id="r1", seq=1, step=0, key="k", value_json="1")
    assert check.claim(patch) is patch
    with pytest.raises(ConfigError):
        ClaimCheck(InMemoryBlobStore(), threshold=10)


def test_missing_or_altered_objects_are_named() -> None:
    store = InMemoryBlobStore()
    check = ClaimCheck(store)
    claimed = check.claim(_returned(BIG))
    [claim] = claimed.claims  # type: ignore[attr-defined]
    store.objects[claim.key] = b"y" * 300_000
    with pytest.raises(PayloadUnavailable, match="does not match its hash") as bad:
        check.restore(claimed)
    assert (bad.value.run_id, bad.value.step, bad.value.key) == ("r1", 3, claim.key)
    del store.objects[claim.key]
    with pytest.raises(PayloadUnavailable, match=r"run r1, step 3, key sha256/"):
        check.restore(claimed)


@pytest.mark.parametrize("length", [255, 256, 257, 1024, 1025, 4000])
@pytest.mark.parametrize("char", ["x", "é", "€", "😀"])
def test_large_says_yes_whenever_claim_would_store(length: int, char: str) -> None:
    """``large`` is the cheap check that lets small events skip the object store:
    it may say yes for an event ``claim`` keeps whole, never no for one it claims."""
    check = ClaimCheck(InMemoryBlobStore(), threshold=1024)
    for event in (
        _returned(char * length),
        ModelResponded(
            run_id="r1",
            seq=2,
            step=1,
            content=None,
            tool_calls=(ToolCall(call_id="c", name="t", args_json=char * length),),
        ),
    ):
        claimed = check.claim(event) is not event
        assert check.large(event) or not claimed


def test_a_large_input_leaves_its_command_and_its_run_started() -> None:
    """A start's and a provided input over the threshold travel by reference: the
    client stores them, the worker reads them back; the run's first event claims
    the input again (same content, same key)."""
    store = InMemoryBlobStore()
    check = ClaimCheck(store, threshold=1024)
    big = '{"text": "' + "y" * 5000 + '"}'
    codec = AvroCodec()
    for command in (
        StartRun(run_id="r1", agent="a", input_json=big),
        ProvideInput(run_id="r1", by="ann", input_json=big),
    ):
        claimed = check.claim_command(command)
        assert claimed.input_json == ""
        [claim] = claimed.claims
        assert (claim.field, claim.size) == ("input_json", len(big))
        wire = codec.decode_command(codec.encode(claimed))
        assert len(codec.encode(claimed)) < 1_000
        assert check.restore_command(wire) == command
        small = command.model_copy(update={"input_json": "{}"})
        assert check.claim_command(small) is small
    started = RunStarted(
        run_id="r1", seq=0, step=0, agent="a", input_json=big, command_id="c"
    )
    claimed_start = check.claim(started)
    assert isinstance(claimed_start, RunStarted)
    assert claimed_start.input_json == ""
    assert check.restore(codec.decode_event(codec.encode(claimed_start))) == started
    gone = check.claim_command(StartRun(run_id="r2", agent="a", input_json=big))
    store.objects.clear()
    with pytest.raises(PayloadUnavailable, match="input_json"):
        check.restore_command(gone)
