"""``Telemetry`` as Prometheus metrics (prometheus-client), served over HTTP.

Workers report steps, appends, model calls, fencing, reconciliations and dead
letters; the projector reports what it projected, its lag, approval waits (from the
``resumed`` events it folds) and runs by status. Each process has its own registry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, final

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_http_server,
)

# From a fraction of a millisecond (an append) to minutes (a model call).
_FAST = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
_SLOW = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# Approvals: from seconds to days.
_HUMAN = (1, 10, 60, 300, 900, 3600, 4 * 3600, 86400, 3 * 86400, 10 * 86400)


@final
class PrometheusTelemetry:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.steps = Counter(
            "es_agents_steps",
            "Steps taken, by agent and kind",
            ["agent", "kind"],
            registry=r,
        )
        self.step_seconds = Histogram(
            "es_agents_step_seconds",
            "Time to take one step (its action and its acknowledgement)",
            ["agent"],
            buckets=(*_FAST, 5, 10, 30, 60, 120, 300),
            registry=r,
        )
        self.append_seconds = Histogram(
            "es_agents_append_seconds",
            "Time from an append to its acknowledgement (fenced)",
            ["agent"],
            buckets=_FAST,
            registry=r,
        )
        self.model_seconds = Histogram(
            "es_agents_model_call_seconds",
            "Model call latency, by agent, model and outcome",
            ["agent", "model", "outcome"],
            buckets=_SLOW,
            registry=r,
        )
        self.fenced_appends = Counter(
            "es_agents_fenced_appends",
            "Appends refused because the partition moved to another worker",
            ["agent"],
            registry=r,
        )
        self.reconciliations = Counter(
            "es_agents_reconciliations",
            "Tool calls whose outcome was reconciled after a crash",
            ["agent"],
            registry=r,
        )
        self.dead_letters = Counter(
            "es_agents_dead_letters",
            "Records sent to the dead-letter topic, by the topic they came from",
            ["topic"],
            registry=r,
        )
        self.events_projected = Counter(
            "es_agents_events_projected",
            "Events the projector wrote to Postgres, by type",
            ["type"],
            registry=r,
        )
        self.projector_lag = Gauge(
            "es_agents_projector_lag_seconds",
            "Age of the last event the projector committed when it committed it",
            registry=r,
        )
        self.approval_wait = Histogram(
            "es_agents_approval_wait_seconds",
            "From a run's pause to the decision that resumed it",
            ["agent"],
            buckets=_HUMAN,
            registry=r,
        )
        self.runs = Gauge(
            "es_agents_runs", "Runs by status (as projected)", ["status"], registry=r
        )

    def serve(self, port: int, addr: str = "127.0.0.1") -> Any:
        """Serve ``/metrics`` on ``addr:port`` (0: any free port) in a daemon
        thread; returns the HTTP server (``server_port`` is the port taken)."""
        server, _thread = start_http_server(port, addr=addr, registry=self.registry)
        return server

    # -- workers -------------------------------------------------------------------
    def step(self, agent: str, kind: str, seconds: float) -> None:
        self.steps.labels(agent, kind).inc()
        self.step_seconds.labels(agent).observe(seconds)

    def append(self, agent: str, seconds: float) -> None:
        self.append_seconds.labels(agent).observe(seconds)

    def model_call(self, agent: str, model: str, seconds: float, ok: bool) -> None:
        self.model_seconds.labels(agent, model, "ok" if ok else "error").observe(
            seconds
        )

    def fenced(self, agent: str) -> None:
        self.fenced_appends.labels(agent).inc()

    def reconciled(self, agent: str) -> None:
        self.reconciliations.labels(agent).inc()

    def dead_letter(self, topic: str) -> None:
        self.dead_letters.labels(topic).inc()

    # -- the projector -------------------------------------------------------------
    def projected(self, types: Sequence[str], lag_seconds: float) -> None:
        for wire_name in types:
            self.events_projected.labels(wire_name).inc()
        self.projector_lag.set(lag_seconds)

    def approval_waited(self, agent: str, seconds: float) -> None:
        self.approval_wait.labels(agent).observe(seconds)

    def runs_by_status(self, counts: Mapping[str, int]) -> None:
        for status, count in counts.items():
            self.runs.labels(status).set(count)
