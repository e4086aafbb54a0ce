"""Run budgets: how far one run may go before the runtime ends it.

A model that keeps answering with tool calls would otherwise call the model for
ever. Before each new model or tool call the runtime asks ``Budget.over``; past a
limit the run fails with ``kind="budget_exceeded"`` and the limit in its error,
which ``status``, ``show``, the UI and the failure metrics carry. Every agent has
one (``DEFAULT_BUDGET`` unless it says otherwise); ``Budget.unlimited()`` turns it
off for an agent that means to run long.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from es_agents.core.state import RunState

BUDGET_EXCEEDED = "budget_exceeded"


@dataclass(frozen=True)
class Budget:
    """Limits per run; None: no limit of that kind. Tokens are prompt plus
    completion tokens as the model reported them; seconds count from the start."""

    max_steps: int | None = None
    max_model_calls: int | None = 1_000
    max_tokens: int | None = 10_000_000
    max_seconds: float | None = None
    # A thread's user messages after its input (a conversational agent ends the
    # thread after answering the last one it may take).
    max_turns: int | None = None

    @staticmethod
    def unlimited() -> Budget:
        return Budget(None, None, None, None, None)

    def __post_init__(self) -> None:
        for name in (
            "max_steps",
            "max_model_calls",
            "max_tokens",
            "max_seconds",
            "max_turns",
        ):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"Budget.{name} must be positive or None: {value}")

    def over(
        self, state: RunState, now: datetime | None, *, model: bool = True
    ) -> str | None:
        """Why ``state`` may not take its next call, or None while within limits.
        ``model``: the call is a model call (model calls and tokens limit those
        only: the tool calls a model asked for within the budget still run)."""
        tokens = state.prompt_tokens + state.completion_tokens
        checks: tuple[tuple[str, float | None, float], ...] = (
            ("steps", self.max_steps, state.step),
            ("model calls", self.max_model_calls if model else None, state.model_calls),
            ("tokens", self.max_tokens if model else None, tokens),
        )
        for what, limit, used in checks:
            if limit is not None and used >= limit:
                return f"budget exceeded: {used:,.0f} {what} of at most {limit:,.0f}"
        turns = self.max_turns  # the last message it may take is still answered
        if model and turns is not None and state.turns > turns:
            return f"budget exceeded: {state.turns:,} turns of at most {turns:,}"
        limit_s, started = self.max_seconds, state.started_at
        if limit_s is None or now is None or started is None:
            return None  # ``now``: None when the caller has no time limit to check
        took = (now - started).total_seconds()
        if took >= limit_s:
            return (
                f"budget exceeded: {took:.0f} s since the start of at most "
                f"{limit_s:g} s"
            )
        return None


DEFAULT_BUDGET = Budget()
