"""A run's row in the ``runs`` projection, as the fold of its log defines it.

The projector writes it (with the partition and offset it read the last event at);
``replay`` recomputes it from the log to check the projection.
"""

from __future__ import annotations

from es_agents.core.state import RunState

RUN_COLUMNS = (
    "run_id",
    "agent",
    "status",
    "step",
    "last_seq",
    "waiting_reason",
    "waiting_gate",
    "wake_at",
    "agent_version",
    "code_revision",
    "prompt_hash",
    "model_id",
    "tools_hash",
    "reducer_version",
    "prompt_tokens",
    "completion_tokens",
    "model_calls",
    "tool_calls",
    "reconciled_calls",
    "output_json",
    "error",
    "started_at",
    "updated_at",
    "origin_run",
    "origin_seq",
)


def run_row(state: RunState) -> dict[str, object]:
    """The ``runs`` columns the fold determines (all but partition and offset)."""
    waiting = state.waiting
    v = state.versions
    values = (
        state.run_id,
        state.agent,
        state.status,
        state.step,
        state.seq,
        waiting.reason if waiting else None,
        waiting.gate if waiting else None,
        waiting.wake_at if waiting else None,
        v.agent_version,
        v.code_revision,
        v.prompt_hash,
        v.model_id,
        v.tools_hash,
        v.reducer_version,
        state.prompt_tokens,
        state.completion_tokens,
        state.model_calls,
        state.tool_calls,
        state.reconciled_calls,
        state.output_json,
        state.error,
        state.started_at,
        state.updated_at,
        state.origin_run,
        state.origin_seq,
    )
    return dict(zip(RUN_COLUMNS, values, strict=True))
