"""``es-agents bench fork``: the time to fork a long run, on a scratch topic.

A run of N events (paused at a gate) is written and projected; a worker serving
its agent runs in this process; ``Client.fork`` sends the fork at the run's last
seq and waits for the worker's verdict, which comes once the fork's copy of the
log is durable. Reported: the median over repeats of that round trip, the copy's
share of it (the worker's own append), and a raw write of the same bytes.
"""

from __future__ import annotations

import json
import statistics
import time
import uuid
from collections.abc import Callable

from es_agents.app import build_ports, build_projector, build_worker
from es_agents.client import Client
from es_agents.lab.bench import GateLoop, _in_thread, _long_run, scratch_settings


def bench_fork(
    length: int, repeats: int, echo: Callable[[str], None]
) -> dict[str, object]:
    with scratch_settings(partitions=1) as settings:
        ports = build_ports(settings)
        origin = f"bench-origin-{uuid.uuid4().hex[:6]}"
        events = _long_run(origin, length)
        for start in range(0, len(events), 2000):
            ports.log.append(events[start : start + 2000])
        echo(f"wrote a run of {length} events (paused at a gate)")
        projector = build_projector(settings, batch_size=5000)
        projector_thread = _in_thread(projector.run)

        def projected(count: int) -> None:
            # Each fork is measured with the projector idle (2 cores: it competes).
            deadline = time.monotonic() + 120
            while projector.projected < count:
                if time.monotonic() > deadline:
                    raise RuntimeError("the projector did not catch up in 120 s")
                time.sleep(0.05)

        projected(len(events))
        worker = build_worker(settings, GateLoop())
        worker_thread = _in_thread(worker.run)
        client = Client(settings)
        times: list[float] = []
        appends: list[float] = []
        try:
            warm = client.fork(origin, 1, wait=60)  # joins the group, warms caches
            if warm.status != "applied":
                raise RuntimeError(f"warm-up fork {warm.status}: {warm.reason}")
            total = len(events) + 4  # the warm-up fork: 2 copies, forked, its pause
            projected(total)
            for _ in range(repeats):
                before = len(worker.append_ms)
                started = time.perf_counter()
                result = client.fork(origin, length - 1, wait=120)
                if result.status != "applied":
                    raise RuntimeError(f"fork {result.status}: {result.reason}")
                times.append((time.perf_counter() - started) * 1000)
                appends.extend(list(worker.append_ms)[before:])
                echo(f"  fork of {length} events: {times[-1]:.0f} ms")
                total += length + 1
                projected(total)
        finally:
            client.close()
            worker.stop()
            projector.stop()
            worker_thread.join(30)
            projector_thread.join(30)
            ports.close()
    summary: dict[str, object] = {
        "store": settings.store,
        "events": length,
        "fork_ms_median": round(statistics.median(times), 1),
        "copy_append_ms_median": round(statistics.median(appends), 1)
        if appends
        else None,
        "repeats": repeats,
    }
    echo(
        f"fork of a {length}-event run: {summary['fork_ms_median']} ms median "
        f"(command -> verdict, the copy durable); the copy's append "
        f"{summary['copy_append_ms_median']} ms"
    )
    echo(json.dumps(summary))
    return summary
