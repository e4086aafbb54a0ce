"""OpenTelemetry spans of a run (in-memory exporter, memory store): one trace per
run across workers and resumes, GenAI attribute names on model and tool spans."""

from __future__ import annotations

import uuid

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from es_agents.adapters.opentelemetry import OpenTelemetryTracer, run_context
from es_agents.app import build_ports, build_worker
from es_agents.core.commands import Approve, StartRun
from es_agents.lab import research
from es_agents.settings import KafkaSettings, Settings


def _worker_run(settings: Settings, exporter: InMemorySpanExporter) -> None:
    """One worker process's life: its own tracer provider, exporting to ``exporter``."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    worker = build_worker(settings, research.agent, until_idle=True, idle_seconds=0.05)
    worker.ctx.tracer = OpenTelemetryTracer(provider)
    worker.run()


def test_one_trace_per_run_across_workers_and_resumes() -> None:
    kafka = KafkaSettings(topic_prefix=f"trace-{uuid.uuid4().hex[:8]}", partitions=2)
    settings = Settings(kafka=kafka, store="memory", payloads="off")
    ports = build_ports(settings)
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    first, second = InMemorySpanExporter(), InMemorySpanExporter()
    ports.log.send(StartRun(run_id=run_id, agent="research", input_json="{}"))
    _worker_run(settings, first)  # to the approval gate
    ports.log.send(Approve(run_id=run_id, by="ann"))
    _worker_run(settings, second)  # another worker resumes it to the end
    spans: list[ReadableSpan] = [
        *first.get_finished_spans(),
        *second.get_finished_spans(),
    ]
    assert first.get_finished_spans()
    assert second.get_finished_spans()
    root = run_context(run_id)
    assert {s.context.trace_id for s in spans if s.context} == {root.trace_id}
    activations = [s for s in spans if s.name == "invoke_agent research"]
    assert len(activations) >= 2  # one per worker that took the run up
    assert all(
        s.parent is not None and s.parent.span_id == root.span_id for s in activations
    )
    chats = [s for s in spans if s.name.startswith("chat ")]
    assert chats
    attrs = dict(chats[0].attributes or {})
    assert attrs["gen_ai.operation.name"] == "chat"
    assert research.agent.model is not None
    assert attrs["gen_ai.request.model"] == research.agent.model.model_id
    assert int(str(attrs["gen_ai.usage.input_tokens"])) > 0
    tools = [s for s in spans if s.name.startswith("execute_tool ")]
    assert {dict(s.attributes or {})["gen_ai.tool.name"] for s in tools} == {
        "search",
        "create_ticket",
    }
    steps = [s for s in spans if s.name.startswith("step ")]
    kinds = {dict(s.attributes or {})["es_agents.step.kind"] for s in steps}
    assert {"model", "tool", "interrupt", "finish"} <= kinds
    by_id = {s.context.span_id: s for s in spans if s.context}
    for span in chats + tools:  # each under its step, each step under an activation
        assert span.parent is not None
        step = by_id[span.parent.span_id]
        assert step.name.startswith("step ")
        assert step.parent is not None
        assert by_id[step.parent.span_id].name == "invoke_agent research"
