"""The models' shared rate limits (``ports.ModelRates``) on every store: a window's
requests and tokens hold the next callers, concurrent callers never take more than
the window has, a cool-down holds everyone, and models are counted apart."""

from __future__ import annotations

import threading
import uuid

from es_agents.core.rates import ModelRate
from es_agents.ports import ModelRates, Ports


def _rates(ports: Ports) -> tuple[ModelRates, str]:
    ports.migrate()
    assert ports.rates is not None
    return ports.rates, f"model-{uuid.uuid4().hex[:8]}"


def test_concurrent_callers_take_no_more_than_the_window_has(ports: Ports) -> None:
    rates, model = _rates(ports)
    rate = ModelRate(requests_per_minute=5)
    took: list[float] = []
    lock = threading.Lock()

    def take() -> None:
        wait = rates.take(model, rate)
        with lock:
            took.append(wait)

    threads = [threading.Thread(target=take) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    gone = [w for w in took if w == 0.0]
    held = [w for w in took if w > 0]
    # Five went, unless the minute turned meanwhile (then a few more, never all).
    assert 5 <= len(gone) < 12
    assert all(0 < w <= 60 for w in held)
    assert rates.take(f"{model}-other", rate) == 0.0


def test_tokens_and_cool_downs_hold_the_next_callers(ports: Ports) -> None:
    rates, model = _rates(ports)
    rate = ModelRate(tokens_per_minute=100)
    assert rates.take(model, rate) == 0.0
    rates.spend(model, 150)
    wait = rates.take(model, rate)
    assert 0 < wait <= 60  # until the next minute
    other = f"{model}-cool"
    rates.cool_down(other, 30)
    assert 25 < rates.take(other, ModelRate()) <= 30
