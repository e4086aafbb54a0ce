from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from es_agents.core import RunState, fold, replay
from es_agents.core.events import (
    Interrupted,
    ModelCallRequested,
    Resumed,
    RunCompleted,
    StatePatched,
    ToolReturned,
)
from es_agents.core.state import PendingModelCall, PendingToolCall
from es_agents.errors import FoldError
from es_agents.lab.demo import script


def test_demo_script_folds_to_completed() -> None:
    events = script("run-1", steps=3)
    state = replay(events)
    assert state.status == "completed"
    assert state.seq == len(events) - 1
    assert state.tool_calls == 3
    assert state.model_calls == 4
    assert state.model_attempts == 4
    assert state.pending is None
    assert json.loads(state.output_json or "null") == {"tickets": 3}
    assert state.last_resume is not None
    assert state.last_resume.by == "demo"
    roles = [m["role"] for m in state.transcript]
    assert roles == ["assistant", "tool"] * 3 + ["assistant"]


def test_dangling_intentions_are_visible_in_state() -> None:
    events = script("run-1", steps=1)
    after_model_request = replay(events[:2])
    assert isinstance(after_model_request.pending, PendingModelCall)
    after_tool_request = replay(events[:4])
    assert isinstance(after_tool_request.pending, PendingToolCall)
    assert after_tool_request.pending.idempotency_key == "run-1:2"
    assert replay(events[:5]).pending is None


def test_interrupt_pauses_and_resume_runs() -> None:
    events = script("run-1", steps=1)
    i = next(n for n, e in enumerate(events) if isinstance(e, Interrupted))
    paused = replay(events[: i + 1])
    assert paused.status == "paused"
    assert paused.waiting is not None
    assert paused.waiting.reason == "awaiting_approval"
    resumed = replay(events[: i + 2])
    assert resumed.status == "running"
    assert resumed.waiting is None


def test_gap_wrong_run_and_after_terminal_are_refused() -> None:
    events = script("run-1", steps=1)
    state = replay(events[:2])
    with pytest.raises(FoldError, match="expected seq 2"):
        fold(state, events[3])
    with pytest.raises(FoldError, match="folded into run"):
        fold(RunState(run_id="other"), events[0])
    done = replay(events)
    late = StatePatched(
        run_id="run-1", seq=done.seq + 1, step=done.step, key="k", value_json="1"
    )
    with pytest.raises(FoldError, match="is completed"):
        fold(done, late)


def test_outcome_without_intention_is_refused() -> None:
    events = script("run-1", steps=1)
    state = replay(events[:1])
    with pytest.raises(FoldError, match="without its request"):
        fold(
            state,
            ToolReturned(
                run_id="run-1", seq=1, step=1, call_id="nope", result_json="1"
            ),
        )
    with pytest.raises(FoldError, match="cannot resume"):
        fold(state, Resumed(run_id="run-1", seq=1, step=1, reason="approved"))


def test_model_call_while_tool_pending_is_refused() -> None:
    events = script("run-1", steps=1)
    state = replay(events[:4])
    with pytest.raises(FoldError, match="tool call is pending"):
        fold(
            state,
            ModelCallRequested(
                run_id="run-1",
                seq=4,
                step=3,
                messages_hash="h",
                message_count=1,
                params_json="{}",
            ),
        )


def test_replay_does_not_touch_its_start_state() -> None:
    events = script("run-1", steps=2)
    start = replay(events[:3])
    before = copy.deepcopy(start)
    replay(events[3:], start)
    assert start == before


@settings(max_examples=40, deadline=None)
@given(steps=st.integers(1, 12), k=st.integers(1, 30), cut=st.integers(0, 10_000))
def test_snapshot_plus_tail_equals_full_fold(steps: int, k: int, cut: int) -> None:
    events = script("run-h", steps=steps)
    prefix = events[: 1 + cut % len(events)]
    full = replay(prefix)
    # A snapshot every k events, then the tail after the last snapshot.
    last_snapshot_at = ((len(prefix) - 1) // k) * k
    snapshot = replay(prefix[: last_snapshot_at + 1])
    resumed = replay(prefix[last_snapshot_at + 1 :], snapshot)
    assert resumed == full
    assert len(prefix) - last_snapshot_at - 1 < k


def test_state_patches_fold_into_vars() -> None:
    events = script("run-1", steps=1)[:1]
    events.append(
        StatePatched(run_id="run-1", seq=1, step=0, key="plan", value_json='{"n": 2}')
    )
    events.append(RunCompleted(run_id="run-1", seq=2, step=0, output_json="null"))
    state = replay(events)
    assert state.vars == {"plan": {"n": 2}}


@settings(max_examples=30, deadline=None)
@given(steps=st.integers(1, 8), cut=st.integers(0, 10_000))
def test_snapshots_round_trip_through_json(steps: int, cut: int) -> None:
    import json  # noqa: PLC0415

    from es_agents.core.snapshot import from_snapshot, to_snapshot  # noqa: PLC0415

    events = script("run-s", steps=steps)
    state = replay(events[: 1 + cut % len(events)])
    assert from_snapshot(json.loads(json.dumps(to_snapshot(state)))) == state
