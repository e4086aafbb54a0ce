"""``bench projector``: projection lag under load, and catch-up events/s next to a
bare confluent-kafka consumer reading the same topic (Kafka store)."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable

from confluent_kafka import Consumer

from es_agents.app import build_ports, build_projector
from es_agents.core.events import Event, StatePatched
from es_agents.lab.bench import _in_thread, _started, scratch_settings
from es_agents.settings import Settings, load_settings


def bench_projector(
    runs: int,
    seconds: float,
    echo: Callable[[str], None],
) -> dict[str, object]:
    """Projection lag under load, and catch-up events/s vs a bare consumer."""
    with scratch_settings(partitions=load_settings().kafka.partitions) as settings:
        return _bench_projector(settings, runs, seconds, echo)


def _bench_projector(
    settings: Settings,
    runs: int,
    seconds: float,
    echo: Callable[[str], None],
) -> dict[str, object]:
    ports = build_ports(settings)
    log = ports.log
    projector = build_projector(settings, batch_size=2000)
    projector_thread = _in_thread(projector.run)
    time.sleep(2.0)
    stop = threading.Event()
    written = [0]
    lock = threading.Lock()

    def writer(ids: list[str]) -> None:
        seqs = dict.fromkeys(ids, 0)
        while not stop.is_set():
            for run_id in ids:
                if seqs[run_id] == 0:
                    batch: list[Event] = [_started(run_id)]
                else:
                    batch = [
                        StatePatched(
                            run_id=run_id,
                            seq=seqs[run_id] + i,
                            step=0,
                            key="k",
                            value_json=str(i),
                        )
                        for i in range(2)
                    ]
                log.append(batch)
                seqs[run_id] += len(batch)
                with lock:
                    written[0] += len(batch)

    ids = [f"load-{n}-{uuid.uuid4().hex[:6]}" for n in range(runs)]
    writers = [
        threading.Thread(target=writer, args=(ids[i::8],), daemon=True)
        for i in range(8)
    ]
    for thread in writers:
        thread.start()
    time.sleep(seconds)
    stop.set()
    for t in writers:
        t.join()
    while projector.projected < written[0]:
        time.sleep(0.05)
    projector.stop()
    projector_thread.join(30)
    lags = sorted(projector.lags_ms)
    p50, p99 = lags[len(lags) // 2], lags[int(len(lags) * 0.99)]

    # Catch-up: a fresh projection of the whole topic vs a bare consumer reading it.
    bare = Consumer(
        {
            "bootstrap.servers": settings.kafka.bootstrap_servers,
            "group.id": f"bare-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    bare.subscribe([settings.kafka.events_topic])
    count, t0 = 0, time.perf_counter()
    while count < written[0]:
        count += sum(1 for m in bare.consume(5000, timeout=0.5) if m.error() is None)
    bare_rate = count / (time.perf_counter() - t0)
    bare.close()
    catchup = build_projector(
        settings.model_copy(
            update={"projector_group": f"catchup-{uuid.uuid4().hex[:6]}"}
        ),
        batch_size=5000,
    )
    with catchup.db.transaction() as conn:  # a fresh projection: empty tables
        conn.execute(
            "TRUNCATE runs, run_events, run_tails, run_snapshots, run_transcripts"
        )
    t0 = time.perf_counter()
    catchup.run(until_caught_up=True, idle_seconds=0.2)
    projector_rate = catchup.projected / (time.perf_counter() - t0 - 0.2)
    ports.close()
    result: dict[str, object] = {
        "runs": runs,
        "events": written[0],
        "write_events_per_s": round(written[0] / seconds),
        "lag_ms_p50": round(p50, 1),
        "lag_ms_p99": round(p99, 1),
        "projector_events_per_s": round(projector_rate),
        "bare_consumer_events_per_s": round(bare_rate),
        "ratio_projector_to_bare": round(projector_rate / bare_rate, 3),
    }
    echo(
        f"{runs} runs wrote {written[0]} events in {seconds:.0f}s; projection lag "
        f"p50 {p50:.1f} ms, p99 {p99:.1f} ms"
    )
    echo(
        f"catch-up: projector {projector_rate:.0f} events/s vs bare consumer "
        f"{bare_rate:.0f} events/s"
    )
    echo(json.dumps(result))
    return result
