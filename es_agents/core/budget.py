"""Run budgets: how far one run may go before the runtime stops it.

A model that keeps answering with tool calls would otherwise call the model for
ever. Before each new model or tool call the runtime asks ``Budget.over``; past a
limit, by the budget's ``on_exceeded``:

* ``"fail"`` (the default): the run fails with ``kind="budget_exceeded"`` and the
  limit in its error;
* ``"pause"``: the run pauses (reason ``budget_exceeded``) for a person: ``approve``
  grants it as much again of every limit (``budget:grants`` counts the grants),
  ``reject`` fails it.

``status``, ``show``, the UI and the step metric (``kind="budget"``) carry the
reason. Every agent has a budget (``DEFAULT_BUDGET`` unless it says otherwise;
``Budget.unlimited()`` turns it off); a run may be started with its own limits
(``start --budget``), kept in the run's log as the state variable ``budget``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from datetime import datetime
from typing import Literal

from es_agents.core.state import RunState

BUDGET_EXCEEDED = "budget_exceeded"
BUDGET_KEY = "budget"  # a run's own limits (a JSON object), patched at its start
GRANTS_KEY = "budget:grants"  # how many times a person granted it as much again
LIMITS = (
    "max_steps",
    "max_model_calls",
    "max_tokens",
    "max_cost",
    "max_seconds",
    "max_turns",
)


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
    # USD, as the settings' prices (ES_AGENTS_PRICES) price the run's model.
    max_cost: float | None = None
    on_exceeded: Literal["fail", "pause"] = "fail"

    @staticmethod
    def unlimited() -> Budget:
        return Budget(None, None, None, None, None, None)

    def __post_init__(self) -> None:
        for name in LIMITS:
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or value <= 0
            ):
                raise ValueError(f"Budget.{name} must be positive or None: {value!r}")
        if self.on_exceeded not in ("fail", "pause"):
            raise ValueError(
                f"Budget.on_exceeded: 'fail' or 'pause', not {self.on_exceeded!r}"
            )

    def with_overrides(self, overrides: dict[str, object]) -> Budget:
        """This budget with some of its fields replaced (a run's own limits)."""
        unknown = sorted(set(overrides) - {f.name for f in fields(self)})
        if unknown:
            raise ValueError(
                f"budget: unknown limit(s) {', '.join(unknown)} (known: "
                f"{', '.join((*LIMITS, 'on_exceeded'))})"
            )
        return replace(self, **overrides)  # type: ignore[arg-type]

    def granted(self, times: int) -> Budget:
        """``times`` more of every limit (a person's grants at a budget pause)."""
        if times <= 0:
            return self
        more = {
            name: value * (1 + times)
            for name in LIMITS
            if (value := getattr(self, name)) is not None
        }
        return replace(self, **more)

    def _cost_over(self, state: RunState, cost: float | None) -> str | None:
        if self.max_cost is None:
            return None
        if cost is None:
            return (
                f"budget: a cost limit ({self.max_cost:g} USD) and no price for "
                f"model {state.versions.model_id!r} (ES_AGENTS_PRICES)"
            )
        if cost >= self.max_cost:
            return f"budget exceeded: {cost:.4f} USD of at most {self.max_cost:g} USD"
        return None

    def over(
        self,
        state: RunState,
        now: datetime | None,
        *,
        model: bool = True,
        cost: float | None = None,
    ) -> str | None:
        """Why ``state`` may not take its next call, or None while within limits.
        ``model``: the call is a model call (model calls, tokens and cost limit
        those only: the tool calls a model asked for within the budget still run).
        ``cost``: the run's cost so far (None: its model has no price)."""
        tokens = state.prompt_tokens + state.completion_tokens
        checks: tuple[tuple[str, float | None, float], ...] = (
            ("steps", self.max_steps, state.step),
            ("model calls", self.max_model_calls if model else None, state.model_calls),
            ("tokens", self.max_tokens if model else None, tokens),
        )
        for what, limit, used in checks:
            if limit is not None and used >= limit:
                return f"budget exceeded: {used:,.0f} {what} of at most {limit:,.0f}"
        if model and (why := self._cost_over(state, cost)) is not None:
            return why
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


def parse_overrides(text: str) -> dict[str, object]:
    """A run's own limits as JSON text (``{"max_steps": 20, ...}``), checked
    against a budget's fields; raises ``ValueError`` with the reason."""
    try:
        value = json.loads(text)
    except ValueError as e:
        raise ValueError(f"budget: not JSON ({e})") from None
    if not isinstance(value, dict):
        raise ValueError(  # noqa: TRY004 - callers catch ValueError: a bad input
            'budget: a JSON object of limits, like {"max_steps": 20}'
        )
    DEFAULT_BUDGET.with_overrides(value)  # raises for an unknown or bad limit
    return value


def for_run(base: Budget, state: RunState) -> Budget:
    """The budget ``state``'s run goes by: ``base`` (its agent's), with the run's
    own limits and as many more as a person granted."""
    budget = base
    own = state.vars.get(BUDGET_KEY)
    if isinstance(own, dict):
        budget = budget.with_overrides(dict(own))
    grants = state.vars.get(GRANTS_KEY)
    return budget.granted(grants if isinstance(grants, int) else 0)
