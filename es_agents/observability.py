"""What workers and the projector tell about themselves: metrics (``Telemetry``)
and traces (``Tracer``), each a port with a no-op default, so the runtime names no
observability library (``adapters/prometheus.py`` and ``adapters/opentelemetry.py``
are the real ones, chosen in ``es_agents.app``)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol


class Telemetry(Protocol):
    """What workers and the projector report as metrics; nothing by default.
    Kinds of step: model, tool, tools, patch, interrupt, finish, fail, budget (a
    run stopped by its budget), reconcile."""

    def step(self, agent: str, kind: str, seconds: float) -> None: ...

    def append(self, agent: str, seconds: float) -> None: ...

    def model_call(self, agent: str, model: str, seconds: float, ok: bool) -> None: ...

    def fenced(self, agent: str) -> None: ...

    def reconciled(self, agent: str) -> None: ...

    def dead_letter(self, topic: str) -> None: ...

    def projected(self, types: Sequence[str], lag_seconds: float) -> None: ...

    def approval_waited(self, agent: str, seconds: float) -> None: ...

    def runs_by_status(self, counts: Mapping[str, int]) -> None: ...


class NoTelemetry:
    def step(self, agent: str, kind: str, seconds: float) -> None:
        pass

    def append(self, agent: str, seconds: float) -> None:
        pass

    def model_call(self, agent: str, model: str, seconds: float, ok: bool) -> None:
        pass

    def fenced(self, agent: str) -> None:
        pass

    def reconciled(self, agent: str) -> None:
        pass

    def dead_letter(self, topic: str) -> None:
        pass

    def projected(self, types: Sequence[str], lag_seconds: float) -> None:
        pass

    def approval_waited(self, agent: str, seconds: float) -> None:
        pass

    def runs_by_status(self, counts: Mapping[str, int]) -> None:
        pass


class Span(Protocol):
    def set(self, key: str, value: str | int | float | bool) -> None: ...


class Tracer(Protocol):
    """Spans of runs and steps (OpenTelemetry when configured); nothing by default.
    Every span of a run belongs to the run's one trace, whichever process made it;
    ``headers`` is the current span's context, written beside each event."""

    def activation(self, agent: str, run_id: str) -> AbstractContextManager[Span]: ...

    def step(
        self, agent: str, run_id: str, step: int
    ) -> AbstractContextManager[Span]: ...

    def model_call(self, model: str) -> AbstractContextManager[Span]: ...

    def tool_call(self, tool: str, call_id: str) -> AbstractContextManager[Span]: ...

    def headers(self) -> tuple[tuple[str, bytes], ...]: ...


class NoSpan:
    def set(self, key: str, value: str | int | float | bool) -> None:
        pass


class NoTracer:
    @contextmanager
    def _nothing(self) -> Iterator[Span]:
        yield NoSpan()

    def activation(self, agent: str, run_id: str) -> AbstractContextManager[Span]:
        return self._nothing()

    def step(self, agent: str, run_id: str, step: int) -> AbstractContextManager[Span]:
        return self._nothing()

    def model_call(self, model: str) -> AbstractContextManager[Span]:
        return self._nothing()

    def tool_call(self, tool: str, call_id: str) -> AbstractContextManager[Span]:
        return self._nothing()

    def headers(self) -> tuple[tuple[str, bytes], ...]:
        return ()
