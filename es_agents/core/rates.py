"""A model's rate limits, shared by every worker of a cluster: requests and tokens
per minute, counted in fixed one-minute windows, and a cool-down every worker
honours after the model said 429 with a ``Retry-After``.

``wait_for`` decides, purely, whether one more request may go now or how long to
wait: the store (``ports.ModelRates``) keeps the window's counts and applies it
under a row lock, so two workers never both take the last request of a window.
Tokens are counted when the answer says how many it used: a request may start
while the window has tokens left, and the window's excess delays the next ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

WINDOW = timedelta(minutes=1)


class InvalidRate(ValueError):
    pass


@dataclass(frozen=True)
class ModelRate:
    """At most ``requests_per_minute`` calls and ``tokens_per_minute`` tokens (in
    and out) of one model id per minute, over all workers; None: no such limit."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None

    def __post_init__(self) -> None:
        for name in ("requests_per_minute", "tokens_per_minute"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise InvalidRate(f"{name} must be a whole number ≥ 1, not {value!r}")


@dataclass(frozen=True)
class Window:
    """A model's counts: the minute they are of, and a cool-down's end (or None)."""

    start: datetime
    requests: int = 0
    tokens: int = 0
    cool_until: datetime | None = None


def window_start(now: datetime) -> datetime:
    return now.replace(second=0, microsecond=0)


def current(window: Window | None, now: datetime) -> Window:
    """The counts as of ``now``: a new window when the kept one is over."""
    start = window_start(now)
    if window is None:
        return Window(start)
    if window.start < start:
        return Window(start, cool_until=window.cool_until)
    return window


def wait_for(window: Window, rate: ModelRate, now: datetime) -> float:
    """Seconds before one more request may go (0.0: now)."""
    if window.cool_until is not None and window.cool_until > now:
        return (window.cool_until - now).total_seconds()
    full = (
        rate.requests_per_minute is not None
        and window.requests >= rate.requests_per_minute
    ) or (
        rate.tokens_per_minute is not None and window.tokens >= rate.tokens_per_minute
    )
    if full:
        return max(0.001, (window.start + WINDOW - now).total_seconds())
    return 0.0
