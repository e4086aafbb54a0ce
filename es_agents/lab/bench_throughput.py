"""``es-agents bench throughput``: many concurrent runs of a no-op agent.

Worker processes (``es-agents worker``, as users run them) serve a tool loop of
``--steps`` no-op tool calls on a scratch topic. For each count of runs, the bench
sends every start at once and counts ``run_completed`` records on the events topic
(by the schema fingerprint in each record's header: no decoding) until all are in:
steps/s and events/s over that window, the workers' CPU (user + system, from
``/proc``) per step and their resident memory. In the same run, a bare
confluent-kafka producer writes as many records of the same size with the same
producer settings, for the ratio. Then the largest count again on two worker
processes, for the scaling ratio. A projector process runs throughout, as in a
deployment (its CPU is not counted in the workers'). Linux only (``/proc``).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from es_agents.codec import AvroCodec
from es_agents.core.commands import StartRun
from es_agents.core.events import ToolReturned
from es_agents.lab import cpu
from es_agents.lab.bench import ToolLoop, scratch_settings, worker_env
from es_agents.settings import Settings

agent = ToolLoop(int(os.environ.get("ES_AGENTS_BENCH_STEPS", "50")))
AGENT = "es_agents.lab.bench_throughput:agent"


def bench_throughput(
    counts: list[int],
    steps: int,
    partitions: int,
    echo: Callable[[str], None],
    scale: list[int] | None = None,
) -> dict[str, object]:
    scale = scale or [2]
    with scratch_settings(partitions=partitions) as settings:
        codec = AvroCodec()
        completed = codec.catalog.latest("run_completed").fingerprint
        warm = 4 * partitions  # every partition's writer made, caches warm
        projector = _projector(settings)
        try:
            rounds, scaled = _rounds(
                settings, counts, steps, completed, warm, echo, scale, projector.pid
            )
        finally:
            projector.terminate()
            projector.wait(30)
        largest = max(counts)
        sample = codec.encode(
            ToolReturned(
                run_id=str(uuid.uuid4()),
                seq=3,
                step=1,
                call_id="c1",
                result_json='{"ok": true}',
                prev=b"\0" * 32,
            )
        )
        raw = _raw_producer(settings, largest * (2 * steps + 2), len(sample))
        echo(
            f"  bare confluent-kafka producer, {len(sample)}-byte records: "
            f"{raw:,.0f} events/s"
        )
    one_largest = rounds[str(largest)]
    summary: dict[str, object] = {
        "store": settings.store,
        "fencing": settings.fencing,
        "steps_per_run": steps,
        "partitions": partitions,
        "one_worker": rounds,
        "workers": {str(n): {str(largest): r} for n, r in scaled.items()},
        "scaling_to_one": {
            str(n): round(r["steps_per_s"] / one_largest["steps_per_s"], 2)
            for n, r in scaled.items()
        },
        "raw_producer_events_per_s": round(raw),
        "ratio_events_to_raw_at_largest": round(one_largest["events_per_s"] / raw, 3),
    }
    echo(json.dumps(summary))
    return summary


def _rounds(  # noqa: PLR0917 - the bench's own parameters
    settings: Settings,
    counts: list[int],
    steps: int,
    completed: bytes,
    warm: int,
    echo: Callable[[str], None],
    scale: list[int],
    projector: int,
) -> tuple[dict[str, dict[str, float]], dict[int, dict[str, float]]]:
    rounds: dict[str, dict[str, float]] = {}
    with _Workers(settings, steps, 1, projector) as one:
        _round(settings, one, warm, steps, completed)
        for n in counts:
            rounds[str(n)] = _round(settings, one, n, steps, completed)
            echo(f"  {n:>5} runs x {steps} steps, 1 worker: {_line(rounds[str(n)])}")
            echo(f"        CPU per step by process: {_by_role(rounds[str(n)])}")
    largest = max(counts)
    scaled: dict[int, dict[str, float]] = {}
    for n in scale:
        with _Workers(settings, steps, n, projector) as more:
            _round(settings, more, warm, steps, completed)
            scaled[n] = _round(settings, more, largest, steps, completed)
        echo(f"  {largest:>5} runs x {steps} steps, {n} workers: {_line(scaled[n])}")
    return rounds, scaled


def _env(settings: Settings, steps: int) -> dict[str, str]:
    return worker_env(settings, ES_AGENTS_BENCH_STEPS=str(steps))


def _projector(settings: Settings) -> subprocess.Popen[bytes]:
    """The projector, as deployments run it: the workers resume from its tables
    (without one, every start would read its partition from the beginning)."""
    return subprocess.Popen(
        [sys.executable, "-m", "es_agents.cli", "projector"],
        env=_env(settings, 0),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _line(r: dict[str, float]) -> str:
    return (
        f"{r['steps_per_s']:,.0f} steps/s, {r['events_per_s']:,.0f} events/s, "
        f"{r['cpu_us_per_step']:.0f} us CPU per step, RSS {r['rss_mb']:.0f} MB"
    )


def _by_role(r: dict[str, float]) -> str:
    parts = ", ".join(
        f"{role} {r[f'{role}_cpu_us_per_step']:.0f}"
        for role in ("projector", "broker", "postgres", "bench")
    )
    return (
        f"{parts} us; the machine {r['machine_cpu_us_per_step']:.0f} us "
        f"({r['machine_busy']:.0%} of {cpu.cores()} cores busy): at most "
        f"~{r['ceiling_steps_per_s']:,.0f} steps/s on them"
    )


class _Workers:
    """Worker processes of the bench agent, up and owning partitions."""

    def __init__(
        self, settings: Settings, steps: int, count: int, projector: int
    ) -> None:
        kafka = settings.kafka
        self.projector = projector
        self.settings = settings
        self.logs = Path(tempfile.mkdtemp(prefix="es-bench-throughput-"))
        env = _env(settings, steps)
        self._producer: Producer | None = None
        group = f"{kafka.topic_prefix}.workers.bench-{count}"
        self.procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "es_agents.cli",
                    "worker",
                    "--agent",
                    AGENT,
                    "--group",
                    group,
                    "--instance-id",
                    f"w{i}-{count}",
                    "--threads",
                    "256",
                ],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=(self.logs / f"w{i}.log").open("w"),
            )
            for i in range(count)
        ]

    @property
    def producer(self) -> Producer:
        """The bench's producer of starts: connected before any round is timed."""
        if self._producer is None:
            self._producer = Producer(self.settings.kafka.producer_config())
            self._producer.list_topics(self.settings.kafka.commands_topic, timeout=10)
        return self._producer

    def __enter__(self) -> _Workers:
        # Up when every process was assigned partitions (a group that settled).
        deadline = time.monotonic() + 60
        while not all(
            "assigned" in (self.logs / f"w{i}.log").read_text()
            for i in range(len(self.procs))
        ):
            if time.monotonic() > deadline or any(
                p.poll() is not None for p in self.procs
            ):
                raise RuntimeError(f"workers did not start: see {self.logs}")
            time.sleep(0.1)
        return self

    def roles(self) -> cpu.Roles:
        """The processes a step costs CPU in: the workers (``cpu_us_per_step``),
        and beside them the projector, the broker, Postgres and this bench."""
        return cpu.Roles(
            {
                "worker": lambda: [p.pid for p in self.procs],
                "projector": lambda: [self.projector],
                "broker": cpu.kafka_brokers,
                "postgres": cpu.postgres,
                "bench": lambda: [os.getpid()],
            }
        )

    def rss_mb(self) -> float:
        total = 0
        for p in self.procs:
            for line in Path(f"/proc/{p.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        return total / 1024

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()


def _round(
    settings: Settings, workers: _Workers, n: int, steps: int, completed: bytes
) -> dict[str, float]:
    kafka = settings.kafka
    tag = uuid.uuid4().hex[:6]
    counter = _Completions(settings, completed, f"tp-{tag}-")
    codec = AvroCodec()
    producer = workers.producer
    roles = workers.roles()
    roles.start()
    started = time.perf_counter()
    for i in range(n):
        start = StartRun(run_id=f"tp-{tag}-{i}", agent="bench")
        producer.produce(
            kafka.commands_topic, key=start.run_id, value=codec.encode(start)
        )
    producer.flush(30)
    counter.wait(n, deadline=started + 600)
    took = time.perf_counter() - started
    used = roles.stop()
    counter.close()
    total_steps = n * steps
    result = {
        "runs": n,
        "seconds": round(took, 3),
        "steps_per_s": round(total_steps / took, 1),
        "events_per_s": round(n * (2 * steps + 2) / took, 1),
        "cpu_us_per_step": round(used["worker"] / total_steps * 1e6, 1),
        "rss_mb": round(workers.rss_mb(), 1),
    }
    for role, seconds in used.items():
        if role != "worker":
            result[f"{role}_cpu_us_per_step"] = round(seconds / total_steps * 1e6, 1)
    machine = used["machine"] / total_steps
    result["machine_busy"] = round(used["machine"] / took / cpu.cores(), 3)
    result["ceiling_steps_per_s"] = round(cpu.cores() / machine) if machine else 0
    return result


class _Completions:
    """Counts ``run_completed`` records of runs with a prefix, from the end now."""

    def __init__(self, settings: Settings, fingerprint: bytes, prefix: str) -> None:
        kafka = settings.kafka
        conf = kafka.consumer_config(f"{kafka.topic_prefix}.bench-count-{prefix}")
        conf["isolation.level"] = "read_committed"
        # Counted in batches (the count's end is late by at most 20 ms): fetches
        # per record would cost the broker CPU the workers share.
        conf["fetch.wait.max.ms"] = 20
        conf["fetch.min.bytes"] = 65536
        self.consumer = Consumer(conf)
        meta = self.consumer.list_topics(kafka.events_topic, timeout=10)
        parts = sorted(meta.topics[kafka.events_topic].partitions)
        starts = []
        for p in parts:
            _, high = self.consumer.get_watermark_offsets(
                TopicPartition(kafka.events_topic, p), timeout=10
            )
            starts.append(TopicPartition(kafka.events_topic, p, high))
        self.consumer.assign(starts)
        self.consumer.consume(1, 0.5)  # fetch sessions up before the clock starts
        self.fingerprint = fingerprint
        self.prefix = prefix.encode()
        self.seen = 0

    def wait(self, n: int, deadline: float) -> None:
        while self.seen < n:
            if time.perf_counter() > deadline:
                raise RuntimeError(f"only {self.seen} of {n} runs completed in time")
            for msg in self.consumer.consume(1000, 0.05):
                value = msg.value()
                key = msg.key() or b""
                if (
                    msg.error() is None
                    and value is not None
                    and value[2:10] == self.fingerprint
                    and key.startswith(self.prefix)
                ):
                    self.seen += 1

    def close(self) -> None:
        self.consumer.close()


def _raw_producer(settings: Settings, records: int, size: int) -> float:
    """Events/s of a bare producer with the framework's producer settings."""
    kafka = settings.kafka
    producer = Producer(kafka.producer_config())
    value = os.urandom(size)
    times = []
    for _ in range(3):
        started = time.perf_counter()
        for i in range(records):
            while True:
                try:
                    producer.produce(
                        kafka.events_topic, key=f"raw-{i % 1000}", value=value
                    )
                    break
                except BufferError:
                    producer.poll(0.01)
        producer.flush(60)
        times.append(time.perf_counter() - started)
    return records / statistics.median(times)
