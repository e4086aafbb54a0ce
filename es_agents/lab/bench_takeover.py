"""``es-agents bench takeover``: how long a killed worker's runs wait for another.

One worker process owns every partition of a scratch topic holding ``--paused`` runs
paused at an approval gate (projected, as in a deployment: a projector process runs
throughout) and ``--active`` runs stepping through an endless no-op tool loop. It is
SIGKILLed mid-step, and two ways back are timed, each from the kill:

- **restart**: a new worker process with the killed one's ``--instance-id`` (static
  membership, as a StatefulSet or a process supervisor brings it back). The group
  gives it the dead member's partitions as soon as it joins.
- **replace**: a new worker process with another instance id. The group keeps the
  partitions with the dead member until its session times out
  (``--session-timeout``), then moves them.

Each time: when the new worker was assigned the partitions (the first
``assigned partitions`` line of its log), when each active run took its next step
(the first event of the run written after the kill, by the record's timestamp: p50
and max over the runs), the new worker's resident memory, and then how long an
approval of a paused run takes to its next event (p50 of ``--approvals``, sent one at
a time) — paused runs cost the new worker nothing until a command names them.
"""

from __future__ import annotations

import json
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import psycopg
from confluent_kafka import Consumer, Producer, TopicPartition

from es_agents.app import build_ports, ensure_topics
from es_agents.codec import AvroCodec
from es_agents.core import RunState
from es_agents.core.commands import Approve, Command, StartRun
from es_agents.core.step import CallTool, Interrupt, Step
from es_agents.lab.bench import append_paused, noop, scratch_settings, worker_env
from es_agents.settings import Settings


class Takeover:
    """Runs named ``paused-*`` wait at gate ``g`` (again after each approval); every
    other run calls the no-op tool for ever."""

    name = "bench"
    model = None
    tools = {noop.name: noop}  # noqa: RUF012 - read-only

    def plan(self, state: RunState) -> Step:
        if state.run_id.startswith("paused-"):
            return Interrupt("awaiting_approval", gate="g")
        return CallTool(f"c{state.tool_calls}", "noop", {})

    def versions(self) -> dict[str, str | int]:
        return {"agent_version": "bench-gate-loop@1"}


agent = Takeover()
AGENT = "es_agents.lab.bench_takeover:agent"


class _Tail:
    """Every record of the events topic from now on: (key, timestamp ms)."""

    def __init__(self, settings: Settings) -> None:
        kafka = settings.kafka
        conf = kafka.consumer_config(f"{kafka.topic_prefix}.bench-tail")
        self._consumer = Consumer(conf)
        meta = self._consumer.list_topics(kafka.events_topic, timeout=10)
        starts = []
        for p in sorted(meta.topics[kafka.events_topic].partitions):
            _, high = self._consumer.get_watermark_offsets(
                TopicPartition(kafka.events_topic, p), timeout=10
            )
            starts.append(TopicPartition(kafka.events_topic, p, high))
        self._consumer.assign(starts)
        self._lock = threading.Lock()
        self._records: list[tuple[str, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        while not self._stop.is_set():
            batch = [
                ((m.key() or b"").decode(), m.timestamp()[1])
                for m in self._consumer.consume(1000, 0.05)
                if m.error() is None
            ]
            with self._lock:
                self._records += batch

    def first_after(self, keys: set[str], mark_ms: int) -> dict[str, int]:
        """Each key's first record stamped at or after ``mark_ms``."""
        found: dict[str, int] = {}
        with self._lock:
            records = list(self._records)
        for key, ts in records:
            if ts >= mark_ms and key in keys and key not in found:
                found[key] = ts
        return found

    def wait(self, keys: set[str], mark_ms: int, timeout: float) -> dict[str, int]:
        deadline = time.monotonic() + timeout
        while True:
            found = self.first_after(keys, mark_ms)
            if len(found) == len(keys):
                return found
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{len(keys) - len(found)} of {len(keys)} runs took no step "
                    f"within {timeout:.0f} s"
                )
            time.sleep(0.02)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._consumer.close()


def _now_ms() -> int:
    return int(time.time() * 1000)


def _worker(settings: Settings, instance: str, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "es_agents.cli",
            "worker",
            "--agent",
            AGENT,
            "--group",
            f"{settings.kafka.topic_prefix}.workers.takeover",
            "--instance-id",
            instance,
        ],
        env={**worker_env(settings), "ES_AGENTS_LOG_FORMAT": "json"},
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
    )


def _assigned_ms(log: Path, timeout: float) -> int:
    """When the worker logging to ``log`` was first given partitions."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            msg = str(entry.get("msg", ""))
            if msg.startswith("assigned partitions") and not msg.endswith("[]"):
                return int(datetime.fromisoformat(entry["ts"]).timestamp() * 1000)
        time.sleep(0.05)
    raise RuntimeError(f"the worker was assigned nothing in {timeout:.0f} s: see {log}")


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class _Bench:
    def __init__(self, settings: Settings, logs: Path) -> None:
        self.settings = settings
        self.logs = logs
        self.codec = AvroCodec()
        self.producer = Producer(settings.kafka.producer_config())
        self.tail = _Tail(settings)

    def send(self, commands: list[Command]) -> None:
        topic = self.settings.kafka.commands_topic
        for c in commands:
            self.producer.produce(topic, key=c.run_id, value=self.codec.encode(c))
        self.producer.flush(30)

    def write_paused(self, count: int) -> list[str]:
        ids = append_paused(self.settings, count, 3)
        url = self.settings.database_url.get_secret_value()
        deadline = time.monotonic() + 180
        with psycopg.connect(url, autocommit=True) as conn:
            while True:
                row = conn.execute(
                    "SELECT count(*) FROM runs WHERE status = 'paused'"
                ).fetchone()
                if row is not None and row[0] >= count:
                    return ids
                if time.monotonic() > deadline:
                    raise RuntimeError("the projector did not project the paused runs")
                time.sleep(0.2)

    def take_over(
        self,
        dead: subprocess.Popen[bytes],
        instance: str,
        active: set[str],
        approvals: list[str],
    ) -> tuple[subprocess.Popen[bytes], dict[str, float]]:
        """SIGKILL ``dead`` mid-step, start ``instance``: what it took."""
        time.sleep(2.0)  # the active runs in full swing (load, not synchronization)
        log = self.logs / f"{instance}-{uuid.uuid4().hex[:4]}.log"
        killed = _now_ms()
        dead.send_signal(signal.SIGKILL)
        dead.wait(10)
        heir = _worker(self.settings, instance, log)
        timeout = self.settings.kafka.session_timeout_ms / 1000 + 120
        assigned = _assigned_ms(log, timeout)
        steps = self.tail.wait(active, killed, timeout)
        gaps = sorted(ts - killed for ts in steps.values())
        approved = []
        for run_id in approvals:
            sent = _now_ms()
            self.send([Approve(run_id=run_id, by="bench", gate="g")])
            approved.append(self.tail.wait({run_id}, sent, 60)[run_id] - sent)
        return heir, {
            "assigned_after_s": round((assigned - killed) / 1000, 2),
            "active_next_step_s_p50": round(statistics.median(gaps) / 1000, 2),
            "active_next_step_s_max": round(gaps[-1] / 1000, 2),
            "after_assignment_s_max": round((gaps[-1] - (assigned - killed)) / 1000, 2),
            "approve_ms_p50": round(statistics.median(approved), 1),
            "heir_rss_mb": round(_rss_mb(heir.pid), 1),
        }

    def close(self) -> None:
        self.tail.close()


def bench_takeover(  # noqa: PLR0917 - the bench's own parameters
    paused: int,
    active: int,
    partitions: int,
    session_timeout_ms: int,
    approvals: int,
    echo: Callable[[str], None],
) -> dict[str, object]:
    logs = Path(tempfile.mkdtemp(prefix="es-bench-takeover-"))
    with scratch_settings(partitions=partitions) as scratch:
        kafka = scratch.kafka.model_copy(
            update={"session_timeout_ms": session_timeout_ms}
        )
        settings = scratch.model_copy(update={"kafka": kafka})
        ensure_topics(settings)
        build_ports(settings).close()  # the tables, before the projector starts
        projector = subprocess.Popen(
            [sys.executable, "-m", "es_agents.cli", "projector"],
            env=worker_env(settings),
            stdout=subprocess.DEVNULL,
            stderr=(logs / "projector.log").open("w"),
        )
        bench = _Bench(settings, logs)
        workers: list[subprocess.Popen[bytes]] = []
        try:
            paused_ids = bench.write_paused(paused)
            echo(f"  {paused:,} paused runs written and projected")
            first = _worker(settings, "w-a", logs / "w-a.log")
            workers.append(first)
            _assigned_ms(logs / "w-a.log", 120)
            tag = uuid.uuid4().hex[:6]
            active_ids = {f"active-{tag}-{i}" for i in range(active)}
            started = _now_ms()
            bench.send([StartRun(run_id=r, agent="bench") for r in active_ids])
            bench.tail.wait(active_ids, started, 120)
            echo(f"  {active} active runs stepping on worker w-a")
            results: dict[str, dict[str, float]] = {}
            heir = first
            for way, instance in (("restart", "w-a"), ("replace", "w-b")):
                asked = (
                    paused_ids[:approvals]
                    if way == "restart"
                    else paused_ids[approvals : 2 * approvals]
                )
                heir, results[way] = bench.take_over(heir, instance, active_ids, asked)
                workers.append(heir)
                echo(f"  {way} ({instance}): {_line(results[way])}")
        finally:
            bench.close()
            for p in [*workers, projector]:
                if p.poll() is None:
                    p.terminate()
            for p in [*workers, projector]:
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
    summary: dict[str, object] = {
        "store": settings.store,
        "fencing": settings.fencing,
        "partitions": partitions,
        "paused_runs": paused,
        "active_runs": active,
        "session_timeout_s": session_timeout_ms / 1000,
        **results,
    }
    echo(json.dumps(summary))
    return summary


def _line(r: dict[str, float]) -> str:
    return (
        f"assigned after {r['assigned_after_s']} s; every active run's next step "
        f"after p50 {r['active_next_step_s_p50']} s, max "
        f"{r['active_next_step_s_max']} s; an approval of a paused run "
        f"{r['approve_ms_p50']} ms (p50); heir RSS {r['heir_rss_mb']} MB"
    )
