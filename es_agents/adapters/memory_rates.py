"""The models' rate limits in memory (``ports.ModelRates``), by ``clock``."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import final

from es_agents.core.rates import ModelRate, Window, current, wait_for


@final
class MemoryModelRates:
    def __init__(self, clock: Callable[[], datetime] | None = None) -> None:
        self._windows: dict[str, Window] = {}
        self._lock = threading.Lock()
        self.clock: Callable[[], datetime] = clock or (lambda: datetime.now(UTC))

    def take(self, model_id: str, rate: ModelRate) -> float:
        now = self.clock()
        with self._lock:
            window = current(self._windows.get(model_id), now)
            wait = wait_for(window, rate, now)
            if wait == 0.0:
                window = replace(window, requests=window.requests + 1)
            self._windows[model_id] = window
            return wait

    def spend(self, model_id: str, tokens: int) -> None:
        now = self.clock()
        with self._lock:
            window = current(self._windows.get(model_id), now)
            self._windows[model_id] = replace(window, tokens=window.tokens + tokens)

    def cool_down(self, model_id: str, seconds: float) -> None:
        now = self.clock()
        until = now + timedelta(seconds=seconds)
        with self._lock:
            window = current(self._windows.get(model_id), now)
            if window.cool_until is None or window.cool_until < until:
                window = replace(window, cool_until=until)
            self._windows[model_id] = window
