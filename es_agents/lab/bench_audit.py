"""``bench audit``: the whole-topic audit on a scratch topic of N events (runs shaped
like the research agent's, with model calls to price), next to a bare reader of the
same topic in the same run."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable

from es_agents.app import build_ports
from es_agents.audit import audit
from es_agents.core.events import Event
from es_agents.lab.bare import bare_read
from es_agents.lab.bench import scratch_settings
from es_agents.lab.demo import script
from es_agents.settings import ModelPrice, Settings, load_settings

STEPS = 30  # tool rounds per run: 1 + 3 * 30 + 3 = 94 events


def bench_audit(events: int, echo: Callable[[str], None]) -> dict[str, object]:
    partitions = load_settings().kafka.partitions
    with scratch_settings(partitions=partitions) as settings:
        return _bench(settings, events, echo)


def _bench(
    settings: Settings, events: int, echo: Callable[[str], None]
) -> dict[str, object]:
    ports = build_ports(settings)
    written, started = 0, time.perf_counter()
    batch: list[Event] = []
    try:
        while written < events:
            run = script(f"audit-{uuid.uuid4().hex[:12]}", steps=STEPS)
            batch += run
            written += len(run)
            if len(batch) >= 2000:
                ports.log.append(batch)
                batch = []
        if batch:
            ports.log.append(batch)
        echo(f"wrote {written:,} events in {time.perf_counter() - started:.1f} s")
        partitions = ports.log.partition_count()
        prices = {"scripted": ModelPrice(input=3.0, output=15.0)}
        report = audit(
            ports.log,
            ports.projections,
            ports.ledger,
            events_topic=settings.kafka.events_topic,
            partitions=partitions,
            prices=prices,
            progress=lambda n, s: echo(f"... {n:,} events audited ({n / s:,.0f}/s)"),
        ).to_json()
    finally:
        ports.close()
    count, seconds = bare_read(settings, partitions)
    bare_rate = count / seconds
    result: dict[str, object] = {
        "store": settings.store,
        "events": report["events"],
        "runs": report["runs"],
        "audit_s": report["seconds"],
        "audit_events_per_s": report["events_per_s"],
        "bare_events_per_s": round(bare_rate),
        "ratio_audit_to_bare": round(float(str(report["events_per_s"])) / bare_rate, 3),
        "problems": report["problem_count"],
        "cost_usd": report["cost"]["total_usd"],
    }
    echo(
        f"audit: {report['events']:,} events, {report['runs']:,} runs in "
        f"{report['seconds']} s = {report['events_per_s']:,} events/s; a bare reader "
        f"{bare_rate:,.0f} events/s ({count:,} records in {seconds:.1f} s)"
    )
    echo(json.dumps(result))
    return result
