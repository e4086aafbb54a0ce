"""``Tracer`` on OpenTelemetry, with the GenAI semantic conventions.

One trace per run, whichever process works on it and however often it resumes: the
trace id and the root span id are derived from the run id, so every activation's
span (``invoke_agent``) joins the same trace as a child of that root. Steps are
spans under their activation; a model call is a ``chat {model}`` span
(``gen_ai.operation.name``, ``gen_ai.request.model``, ``gen_ai.response.model``,
``gen_ai.usage.input_tokens`` / ``output_tokens``), a tool call an
``execute_tool {tool}`` span (``gen_ai.tool.name``, ``gen_ai.tool.call.id``). Each
event is written with the W3C ``traceparent`` of the span that wrote it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, final

from opentelemetry import trace
from opentelemetry.propagate import inject
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags

from es_agents.observability import Span


def run_context(run_id: str) -> SpanContext:
    """The run's root: the same trace id and span id in every process."""
    h = hashlib.sha256(run_id.encode()).digest()
    return SpanContext(
        trace_id=int.from_bytes(h[:16], "big") or 1,
        span_id=int.from_bytes(h[16:24], "big") or 1,
        is_remote=True,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )


class _Span:
    def __init__(self, span: Any) -> None:
        self._span = span

    def set(self, key: str, value: str | int | float | bool) -> None:
        self._span.set_attribute(key, value)


@final
class OpenTelemetryTracer:
    def __init__(self, provider: Any | None = None) -> None:
        """``provider``: a TracerProvider (default: the global one)."""
        self._tracer = trace.get_tracer("es_agents", tracer_provider=provider)

    @contextmanager
    def _span(
        self, name: str, attributes: dict[str, Any], context: Any = None
    ) -> Iterator[Span]:
        with self._tracer.start_as_current_span(
            name, context=context, kind=SpanKind.INTERNAL, attributes=attributes
        ) as span:
            yield _Span(span)

    def activation(self, agent: str, run_id: str) -> AbstractContextManager[Span]:
        root = trace.set_span_in_context(NonRecordingSpan(run_context(run_id)))
        return self._span(
            f"invoke_agent {agent}",
            {
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.name": agent,
                "es_agents.run_id": run_id,
            },
            root,
        )

    def step(self, agent: str, run_id: str, step: int) -> AbstractContextManager[Span]:
        return self._span(
            f"step {step}",
            {
                "gen_ai.agent.name": agent,
                "es_agents.run_id": run_id,
                "es_agents.step": step,
            },
        )

    def model_call(self, model: str) -> AbstractContextManager[Span]:
        return self._span(
            f"chat {model}",
            {"gen_ai.operation.name": "chat", "gen_ai.request.model": model},
        )

    def tool_call(self, tool: str, call_id: str) -> AbstractContextManager[Span]:
        return self._span(
            f"execute_tool {tool}",
            {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": tool,
                "gen_ai.tool.call.id": call_id,
            },
        )

    def headers(self) -> tuple[tuple[str, bytes], ...]:
        carrier: dict[str, str] = {}
        inject(carrier)
        return tuple((k, v.encode()) for k, v in carrier.items())


def otlp_tracer() -> OpenTelemetryTracer:
    """Spans exported by OTLP over HTTP to ``OTEL_EXPORTER_OTLP_ENDPOINT`` (the
    exporter reads the standard ``OTEL_*`` variables), in batches."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
        OTLPSpanExporter,
    )
    from opentelemetry.sdk.resources import Resource  # noqa: PLC0415
    from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415
    from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415

    provider = TracerProvider(resource=Resource.create({"service.name": "es-agents"}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return OpenTelemetryTracer(provider)
