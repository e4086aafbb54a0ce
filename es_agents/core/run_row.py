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
    "last_message",
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
        last_message(state) if state.thread else None,
    )
    return dict(zip(RUN_COLUMNS, values, strict=True))


def last_message(state: RunState) -> str | None:
    """A thread's last message with text, the user's or the model's."""
    transcript = state.transcript
    try:
        for i in range(len(transcript) - 1, max(-1, len(transcript) - 4), -1):
            content = transcript[i].get("content")
            if (
                isinstance(content, str)
                and content
                and transcript[i].get("role") in ("user", "assistant")
            ):
                return content
    except ValueError:  # a stored transcript this state cannot read
        return None
    return None
