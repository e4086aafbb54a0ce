"""On Kafka, each event is written with the W3C traceparent of the span that made it:
the run's trace id, so a consumer of the topic joins the run's trace."""

from __future__ import annotations

import uuid

import pytest
from opentelemetry.sdk.trace import TracerProvider

from es_agents.adapters.kafka import KafkaEventLog
from es_agents.adapters.opentelemetry import OpenTelemetryTracer, run_context
from es_agents.app import build_worker
from es_agents.core.commands import StartRun
from es_agents.settings import KafkaSettings, Settings
from tests import agents

pytestmark = pytest.mark.integration


def test_events_carry_the_runs_trace_context(
    kafka_settings: KafkaSettings, database_url: str
) -> None:
    settings = Settings(kafka=kafka_settings, database_url=database_url, payloads="off")
    log = KafkaEventLog(kafka_settings)
    run_id = f"traced-{uuid.uuid4().hex[:8]}"
    try:
        log.send(StartRun(run_id=run_id, agent="quick"))
        worker = build_worker(settings, agents.quick, until_idle=True, idle_seconds=0.2)
        worker.ctx.tracer = OpenTelemetryTracer(TracerProvider())
        worker.run()
        partition = log.partition_for(run_id)
        records = [
            r
            for r in log.read_partition(kafka_settings.events_topic, partition)
            if r.key == run_id
        ]
    finally:
        log.close()
    assert len(records) >= 5  # started, model, tool, model, completed
    trace_id = f"{run_context(run_id).trace_id:032x}"
    for record in records:
        parents = [v.decode() for k, v in record.headers if k == "traceparent"]
        assert len(parents) == 1, record.headers
        version, trace, span, flags = parents[0].split("-")
        assert (version, trace, flags) == ("00", trace_id, "01")
        assert int(span, 16) != run_context(run_id).span_id  # a step's span
