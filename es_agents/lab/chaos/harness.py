"""The chaos harness: real processes, seeded faults, a heal phase, invariant checks.

On the dev stack (``es-agents dev up``), with a fresh topic prefix and database:
``workers`` worker processes and one projector run the chaos agent while the harness
keeps ``concurrency`` runs going, approves their gates, and injects the schedule's
faults. It supervises like a process manager would: a process that exits is started
again. After the fault window it heals (every service up, no armed crash points,
gates approved, timers fired) until every run has settled, then checks:

- duplicate effects: any key with more than one effect at the effects service;
- lost acknowledged events: a journaled acknowledgement the log does not hold;
- re-issued completions: a model call requested again after its response was
  recorded, or issued without a recorded request;
- the projection: each ``runs`` row and its ``run_events`` count equal the fold of
  the log;
- settled runs: completed, or paused/blocked with a stated reason (never running,
  waiting for an approval or timer that was given, or failed).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import Consumer, TopicPartition

from es_agents.adapters.kafka import KafkaEventLog, _client
from es_agents.adapters.kafka_admin import ensure_topics
from es_agents.codec import AvroCodec
from es_agents.core import RunState, replay
from es_agents.core.commands import Approve, Command, StartRun
from es_agents.core.events import Event, ModelCallRequested, ModelResponded
from es_agents.core.fold import fold
from es_agents.dev import DevStack
from es_agents.errors import EsAgentsError
from es_agents.lab.ack_journal import read_journal
from es_agents.lab.chaos.agent import NAME
from es_agents.lab.chaos.effects import EffectsService
from es_agents.lab.chaos.schedule import Fault, fault_schedule, fingerprint
from es_agents.settings import KafkaSettings, load_settings

AGENT = "es_agents.lab.chaos.agent:agent"
SETTLED_REASONS = ("uncertain_effect", "version_mismatch", "awaiting_input")


@dataclass
class ChaosConfig:
    minutes: float
    seed: int
    workers: int = 2
    partitions: int = 4
    concurrency: int = 30
    heal_seconds: float = 180.0
    session_timeout_ms: int = 6000
    mean_gap: float = 9.0


@dataclass
class Child:
    """A supervised process: started again whenever it exits."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None
    crash_at: str = ""  # armed crash point of the current process
    killed: bool = False  # the harness killed the current process
    paused: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    exits: Counter[str] = field(default_factory=Counter)
    next_start: float = 0.0
    backoff: float = 0.5
    started_at: float = 0.0

    def start(self, crash_at: str = "") -> None:
        env = {**self.env, "ES_AGENTS_CRASH_AT": crash_at}
        with self.log.open("ab") as out:
            self.popen = subprocess.Popen(
                self.argv,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.crash_at, self.killed = crash_at, False
        self.started_at = time.monotonic()

    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(sig)

    def kill(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.killed = True
            self.popen.send_signal(signal.SIGCONT)
            self.popen.kill()
            self.popen.wait(30)

    def stop(self, timeout: float = 60) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.send_signal(signal.SIGCONT)
            self.popen.terminate()
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()

    def supervise(self) -> None:
        """Record an exit and start the process again (with a growing backoff)."""
        with self.lock:
            if self.popen is None or self.paused or self.popen.poll() is None:
                return
            code = self.popen.returncode
            if self.next_start == 0.0:
                if self.killed:
                    kind = "killed_by_chaos"
                elif code == -signal.SIGKILL and self.crash_at:
                    kind = "crash_point"
                else:
                    kind = f"exit_{code}"
                self.exits[kind] += 1
                ran = time.monotonic() - self.started_at
                failing = kind == f"exit_{code}" and ran < 30
                self.backoff = min(self.backoff * 2, 8) if failing else 0.5
                self.next_start = time.monotonic() + self.backoff
                return
            if time.monotonic() >= self.next_start:
                self.next_start = 0.0
                self.start()


class Watcher:
    """Folds every run from the events topic as it is committed (read_committed)."""

    def __init__(self, settings: KafkaSettings, codec: AvroCodec) -> None:
        self.states: dict[str, RunState] = {}
        self.errors: list[str] = []
        self.lock = threading.Lock()
        self._codec = codec
        self._stop = threading.Event()
        self._consumer = Consumer(
            _client(
                {
                    "bootstrap.servers": settings.bootstrap_servers,
                    "group.id": f"chaos-watch-{uuid.uuid4().hex[:8]}",
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                }
            )
        )
        self._consumer.assign(
            [
                TopicPartition(settings.events_topic, p, 0)
                for p in range(settings.partitions)
            ]
        )
        self._thread = threading.Thread(target=self._run, daemon=True, name="watcher")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for msg in self._consumer.consume(500, timeout=0.2):
                if msg.error() is not None:
                    continue
                try:
                    event = self._codec.decode_event(msg.value() or b"")
                    with self.lock:
                        state = self.states.get(event.run_id)
                        if state is None:
                            state = self.states[event.run_id] = RunState(
                                run_id=event.run_id
                            )
                        fold(state, event)
                except EsAgentsError as e:
                    self.errors.append(f"{msg.partition()}@{msg.offset()}: {e}")

    def snapshot(self) -> dict[str, tuple[str, str | None, int]]:
        """run id -> (status, waiting reason, seq)."""
        with self.lock:
            return {
                run_id: (
                    s.status,
                    s.waiting.reason if s.waiting else None,
                    s.seq,
                )
                for run_id, s in self.states.items()
            }

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._consumer.close()


class Sender:
    """Sends commands in order from a queue, retrying through broker outages."""

    def __init__(self, settings: KafkaSettings) -> None:
        self.acked: list[Command] = []
        self._log = KafkaEventLog(settings)
        self._queue: list[Command] = []
        self._cond = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True, name="sender")
        self._thread.start()

    def send(self, command: Command) -> None:
        with self._cond:
            self._queue.append(command)
            self._cond.notify()

    @property
    def pending(self) -> int:
        with self._cond:
            return len(self._queue)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stop:
                    self._cond.wait()
                if self._stop:
                    return
                command = self._queue[0]
            try:
                self._log.send(command)
            except EsAgentsError:
                time.sleep(0.5)  # the broker is down: the same command again
                continue
            with self._cond:
                self._queue.pop(0)
                self.acked.append(command)

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join(60)
        self._log.close()


class Chaos:
    def __init__(self, config: ChaosConfig, echo: Callable[[str], None]) -> None:
        self.config = config
        self.echo = echo
        self.stack = DevStack()
        down = [s.name for s in self.stack.status() if not s.answers]
        if down:
            raise EsAgentsError(
                f"bench chaos kills and restarts the dev stack's services, and "
                f"{', '.join(down)} is not running: run `es-agents dev up` first"
            )
        self.uid = uuid.uuid4().hex[:8]
        self.rng = random.Random(config.seed)  # noqa: S311 - reproducible, not secret
        self.schedule = fault_schedule(
            config.seed, config.minutes * 60, config.workers, config.mean_gap
        )
        base = load_settings()
        self.kafka = base.kafka.model_copy(
            update={
                "topic_prefix": f"chaos-{self.uid}",
                "partitions": config.partitions,
                "session_timeout_ms": config.session_timeout_ms,
            }
        )
        self.database = f"chaos_{self.uid}"
        self.database_url = (
            self.stack.dev.database_url.rsplit("/", 1)[0] + f"/{self.database}"
        )
        self.work = self.stack.dev.root / "chaos" / self.uid
        self.effects = EffectsService()
        self.injected: Counter[str] = Counter()
        self.timeline: list[str] = []
        self.started: dict[str, float] = {}
        self.approved: dict[str, float] = {}
        self.t0 = 0.0

    # -- processes -------------------------------------------------------------------
    def _env(self) -> dict[str, str]:
        env = {
            **os.environ,
            "ES_AGENTS_BOOTSTRAP_SERVERS": self.kafka.bootstrap_servers,
            "ES_AGENTS_TOPIC_PREFIX": self.kafka.topic_prefix,
            "ES_AGENTS_PARTITIONS": str(self.kafka.partitions),
            "ES_AGENTS_SESSION_TIMEOUT_MS": str(self.config.session_timeout_ms),
            "ES_AGENTS_DATABASE_URL": self.database_url,
            "ES_AGENTS_ACK_JOURNAL": str(self.work / "acks.log"),
            "ES_AGENTS_MODEL_CALLS_LOG": str(self.work / "model-calls.jsonl"),
            "ES_AGENTS_CHAOS_EFFECTS_URL": self.effects.url,
        }
        env.pop("ES_AGENTS_CRASH_AT", None)
        return env

    def _children(self) -> tuple[list[Child], Child]:
        cli = [sys.executable, "-m", "es_agents.cli"]
        workers = [
            Child(
                f"worker-{i}",
                [
                    *cli,
                    "worker",
                    "--agent",
                    AGENT,
                    "--instance-id",
                    f"chaos-{self.uid}-w{i}",
                ],
                self._env(),
                self.work / f"worker-{i}.log",
            )
            for i in range(self.config.workers)
        ]
        projector = Child(
            "projector",
            [*cli, "projector", "--instance-id", f"chaos-{self.uid}-p"],
            self._env(),
            self.work / "projector.log",
        )
        return workers, projector

    # -- the run -----------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        config = self.config
        self.work.mkdir(parents=True, exist_ok=True)
        self.stack.postgres.create_database(self.database)
        ensure_topics(self.kafka)
        self.effects.start()
        self.workers, self.projector = self._children()
        children = [*self.workers, self.projector]
        self.echo(
            f"chaos seed {config.seed}: up to {len(self.schedule)} faults in "
            f"{config.minutes * 60:.0f} s (schedule {fingerprint(self.schedule)}), "
            f"{config.workers} workers, {config.partitions} partitions, "
            f"{config.concurrency} concurrent runs; logs in {self.work}"
        )
        for child in children:
            child.start()
        self.watcher = Watcher(self.kafka, AvroCodec())
        self.sender = Sender(self.kafka)
        try:
            self.t0 = time.monotonic()
            injector = threading.Thread(target=self._inject, daemon=True)
            injector.start()
            window_end = self.t0 + config.minutes * 60
            while time.monotonic() < window_end or injector.is_alive():
                self._tick(children, start_runs=time.monotonic() < window_end)
                time.sleep(0.2)
            fault_seconds = time.monotonic() - self.t0
            self.echo(f"fault window over after {fault_seconds:.0f} s: healing")
            heal_seconds, settled = self._heal(children)
            self.echo(
                f"healed in {heal_seconds:.0f} s"
                if settled
                else f"NOT healed after {heal_seconds:.0f} s"
            )
            for child in children:
                child.stop()
            report = self._check(fault_seconds, heal_seconds, children)
        finally:
            for child in children:
                child.stop()
            self.sender.close()
            self.watcher.close()
            self.effects.stop()
        if report["violations"]:
            self.echo(f"kept database {self.database} and the logs for inspection")
        else:
            self.stack.postgres.drop_database(self.database)
        return report

    def _tick(self, children: list[Child], start_runs: bool) -> None:
        for child in children:
            child.supervise()
        states = self.watcher.snapshot()
        if start_runs:
            unsettled = sum(
                1
                for run_id in self.started
                if run_id not in states or not _settled(states[run_id])
            )
            for _ in range(self.config.concurrency - unsettled):
                self._start_run()
        now = time.monotonic()
        for run_id, (status, reason, _) in states.items():
            # A person approves each gate; if the run still waits 20 s later (the
            # command was in flight during a fault), they approve again: same id.
            if (
                status == "paused"
                and reason == "awaiting_approval"
                and now - self.approved.get(run_id, -1e9) > 20
            ):
                self.approved[run_id] = now
                self.sender.send(
                    Approve(
                        run_id=run_id,
                        by="chaos",
                        gate="charge",
                        command_id=f"approve-{run_id}",
                    )
                )

    def _start_run(self) -> None:
        n = len(self.started)
        run_id = f"chaos-{self.uid}-{n:05d}"
        self.started[run_id] = time.monotonic()
        self.sender.send(
            StartRun(
                run_id=run_id,
                agent=NAME,
                input_json=json.dumps(
                    {
                        "order": n,
                        "sleep_seconds": round(self.rng.uniform(0.5, 4.0), 2),
                    }
                ),
                command_id=f"start-{run_id}",
            )
        )

    # -- faults --------------------------------------------------------------------
    def _inject(self) -> None:
        """Each fault after its quiet gap, counted from the end of the previous one;
        none starts after the fault window."""
        window_end = self.t0 + self.config.minutes * 60
        for fault in self.schedule:
            due = time.monotonic() + fault.gap
            if due >= window_end:
                return
            time.sleep(fault.gap)
            started = time.monotonic()
            at = started - self.t0
            try:
                self._apply(fault)
            except Exception as e:  # a fault that could not be injected is reported
                self.timeline.append(f"{at:7.1f}s {fault.kind} FAILED: {e}")
                continue
            self.injected[fault.kind] += 1
            self.timeline.append(
                f"{at:7.1f}s {fault.kind}"
                + (f" worker-{fault.worker}" if fault.worker >= 0 else "")
                + (f" then {fault.crash_at}" if fault.crash_at else "")
                + f" ({time.monotonic() - started:.1f} s)"
            )

    def _apply(self, fault: Fault) -> None:
        if fault.kind == "kill_worker":
            worker = self.workers[fault.worker]
            with worker.lock:
                worker.kill()
                worker.next_start = 0.0
                worker.exits["killed_by_chaos"] += 1
                worker.start(crash_at=fault.crash_at)
        elif fault.kind == "pause_worker":
            worker = self.workers[fault.worker]
            with worker.lock:
                worker.paused = True
                worker.signal(signal.SIGSTOP)
            time.sleep(self.config.session_timeout_ms / 1000 + 4)
            with worker.lock:
                worker.signal(signal.SIGCONT)
                worker.paused = False
        elif fault.kind == "kill_broker":
            self.stack.kafka.kill(signal.SIGKILL)
            time.sleep(1.0)
            self.stack.kafka.start()
        elif fault.kind == "restart_postgres":
            self.stack.postgres.stop()
            time.sleep(1.0)
            self.stack.postgres.start()
        elif fault.kind == "kill_projector":
            with self.projector.lock:
                self.projector.kill()
                self.projector.next_start = 0.0
                self.projector.exits["killed_by_chaos"] += 1
                self.projector.start()
        else:
            raise ValueError(f"unknown fault kind {fault.kind!r}")

    # -- heal ------------------------------------------------------------------------
    def _heal(self, children: list[Child]) -> tuple[float, bool]:
        started = time.monotonic()
        self.stack.kafka.start()
        self.stack.postgres.start()
        for child in children:  # no armed crash point survives into the heal phase
            with child.lock:
                if child.crash_at and child.running():
                    child.stop()
                    child.next_start = 0.0
                    child.start()
        deadline = started + self.config.heal_seconds
        while time.monotonic() < deadline:
            self._tick(children, start_runs=False)
            states = self.watcher.snapshot()
            if (
                self.sender.pending == 0
                and all(run_id in states for run_id in self.started)
                and all(_settled(s) for s in states.values())
            ):
                return time.monotonic() - started, True
            time.sleep(0.2)
        return time.monotonic() - started, False

    # -- checks ----------------------------------------------------------------------
    def _check(
        self, fault_seconds: float, heal_seconds: float, children: list[Child]
    ) -> dict[str, Any]:
        violations: dict[str, list[str]] = defaultdict(list)
        runs = self._read_log(violations)
        states: dict[str, RunState] = {}
        for run_id, events in runs.items():
            try:
                states[run_id] = replay(events)
            except EsAgentsError as e:
                violations["log_refused_by_fold"].append(f"{run_id}: {e}")
        for error in self.watcher.errors:
            violations["log_refused_by_fold"].append(error)

        for key, count in self.effects.effects().items():
            if count > 1:
                violations["duplicate_effect"].append(f"{key}: {count} effects")
        acks = self._check_acks(runs, violations)
        reissued = self._check_model_calls(runs, violations)
        self._check_projection(states, runs, violations)

        outcomes: Counter[str] = Counter()
        for command in self.sender.acked:
            if isinstance(command, StartRun) and command.run_id not in states:
                violations["acknowledged_start_lost"].append(command.run_id)
        for run_id, state in states.items():
            waiting = state.waiting.reason if state.waiting else None
            outcome = f"{state.status}:{waiting}" if waiting else state.status
            outcomes[outcome] += 1
            if not _settled((state.status, waiting, state.seq)):
                violations["unsettled_run"].append(
                    f"{run_id}: {outcome} at seq {state.seq}"
                    + (f" ({state.error})" if state.error else "")
                )

        exits: dict[str, dict[str, int]] = {}
        for child in children:
            kind = child.name.split("-")[0]
            for how, count in child.exits.items():
                exits.setdefault(kind, {}).setdefault(how, 0)
                exits[kind][how] += count
        steps = sum(s.step for s in states.values())
        event_count = sum(len(history) for history in runs.values())
        report: dict[str, Any] = {
            "seed": self.config.seed,
            "schedule": fingerprint(self.schedule),
            "fault_window_s": round(fault_seconds, 1),
            "heal_s": round(heal_seconds, 1),
            "runs": len(states),
            "outcomes": dict(outcomes),
            "steps": steps,
            "events": event_count,
            "steps_per_s": round(steps / max(fault_seconds + heal_seconds, 1), 1),
            "faults_scheduled": len(self.schedule),
            "faults_injected": dict(self.injected),
            "process_exits": exits,
            "reconciled_tool_calls": sum(s.reconciled_calls for s in states.values()),
            "dangling_model_calls_reissued": reissued,
            "charge_resends_absorbed_downstream": sum(
                n - 1 for n in self.effects.charge_requests.values() if n > 1
            ),
            "effects": sum(self.effects.effects().values()),
            "acknowledgements_checked": acks,
            "calls_refused_by_fencing_token": sum(self.effects.fenced.values()),
            "violations": {k: len(v) for k, v in violations.items()},
        }
        self._print(report, violations)
        return report

    def _read_log(self, violations: dict[str, list[str]]) -> dict[str, list[Event]]:
        log = KafkaEventLog(self.kafka)
        runs: dict[str, list[Event]] = defaultdict(list)
        try:
            for partition in range(self.kafka.partitions):
                for msg in log.read_partition(self.kafka.events_topic, partition):
                    try:
                        event = log.codec.decode_event(msg.value)
                    except EsAgentsError as e:
                        violations["undecodable_event"].append(str(e))
                        continue
                    runs[event.run_id].append(event)
        finally:
            log.close()
        return runs

    def _check_acks(
        self, runs: dict[str, list[Event]], violations: dict[str, list[str]]
    ) -> int:
        """Checks every journaled acknowledgement; returns how many there were."""
        path = self.work / "acks.log"
        if not path.exists():
            return 0
        ids = {(e.run_id, e.seq): e.event_id for es in runs.values() for e in es}
        acks = 0
        for acked in read_journal(path):
            acks += 1
            found = ids.get((acked.run_id, acked.seq))
            if found != acked.event_id:
                violations["lost_acknowledged_event"].append(
                    f"{acked.run_id} seq {acked.seq}: acknowledged {acked.event_id}, "
                    f"log has {found}"
                )
        return acks

    def _check_model_calls(
        self, runs: dict[str, list[Event]], violations: dict[str, list[str]]
    ) -> int:
        """Each issued call has a durable request; none follows a recorded response."""
        requested: Counter[str] = Counter()
        reissued = 0
        for run_id, events in runs.items():
            answered: set[str] = set()
            pending: str | None = None
            for event in events:
                if isinstance(event, ModelCallRequested):
                    if event.messages_hash in answered:
                        violations["completion_reissued"].append(
                            f"{run_id} seq {event.seq}: {event.messages_hash[:19]}"
                        )
                    requested[event.messages_hash] += 1
                    reissued += event.attempt > 1
                    pending = event.messages_hash
                elif isinstance(event, ModelResponded) and pending is not None:
                    answered.add(pending)
                    pending = None
        path = self.work / "model-calls.jsonl"
        issued: Counter[str] = Counter()
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    issued[json.loads(line)["hash"]] += 1
                except (ValueError, KeyError):
                    continue  # a torn last line of a killed process
        for digest, count in issued.items():
            if count > requested[digest]:
                violations["model_call_without_request"].append(
                    f"{digest[:19]}: issued {count}, requested {requested[digest]}"
                )
        return reissued

    def _check_projection(
        self,
        states: dict[str, RunState],
        runs: dict[str, list[Event]],
        violations: dict[str, list[str]],
    ) -> None:
        """The projection converges on the fold (the projector may still be behind
        right after the heal: it gets 60 s)."""
        want = {
            run_id: (s.status, s.step, s.seq, s.waiting.reason if s.waiting else None)
            for run_id, s in states.items()
        }
        counts = {run_id: len(events) for run_id, events in runs.items()}
        self.projector.start()  # the projector was stopped with the workers
        deadline = time.monotonic() + 60
        mismatched: list[str] = []
        try:
            while True:
                with psycopg.connect(self.database_url) as conn:
                    rows = conn.execute(
                        "SELECT r.run_id, r.status, r.step, r.last_seq, "
                        "r.waiting_reason, (SELECT count(*) FROM run_events e "
                        "WHERE e.run_id = r.run_id) FROM runs r"
                    ).fetchall()
                got = {r[0]: (r[1], r[2], r[3], r[4]) for r in rows}
                got_counts = {r[0]: r[5] for r in rows}
                mismatched = [
                    f"{run_id}: projection {got.get(run_id)} "
                    f"({got_counts.get(run_id)} events), "
                    f"fold {fold_row} ({counts[run_id]} events)"
                    for run_id, fold_row in want.items()
                    if got.get(run_id) != fold_row
                    or got_counts.get(run_id) != counts[run_id]
                ]
                extra = set(got) - set(want)
                mismatched += [
                    f"{run_id}: projected, not in the log" for run_id in extra
                ]
                if not mismatched or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
        finally:
            self.projector.stop()
        violations["projection_differs_from_fold"] += mismatched
        if not mismatched:
            violations.pop("projection_differs_from_fold")

    def _print(self, report: dict[str, Any], violations: dict[str, list[str]]) -> None:
        echo = self.echo
        echo("\nfaults:")
        for line in self.timeline:
            echo(f"  {line}")
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(report["outcomes"].items()))
        echo(f"\nruns: {report['runs']} ({outcomes})")
        echo(
            f"steps: {report['steps']} ({report['events']} events, "
            f"{report['steps_per_s']} steps/s over the whole run)"
        )
        echo(
            "faults injected: "
            + ", ".join(f"{k} {v}" for k, v in sorted(self.injected.items()))
            + f" (of {report['faults_scheduled']} scheduled)"
        )
        echo(
            "process exits: "
            + "; ".join(
                f"{kind}: " + ", ".join(f"{how} {n}" for how, n in sorted(by.items()))
                for kind, by in report["process_exits"].items()
            )
        )
        echo(
            f"effects: {report['effects']}; reconciled tool calls "
            f"{report['reconciled_tool_calls']}; dangling model calls re-issued "
            f"{report['dangling_model_calls_reissued']}; charge re-sends absorbed "
            f"downstream {report['charge_resends_absorbed_downstream']}; "
            "calls refused by fencing token "
            f"{report['calls_refused_by_fencing_token']}; "
            f"acknowledgements checked {report['acknowledgements_checked']}"
        )
        total = sum(len(v) for v in violations.values())
        echo(f"violations: {total}")
        for kind, items in violations.items():
            echo(f"  {kind}: {len(items)}")
            for item in items[:10]:
                echo(f"    {item}")
        echo(json.dumps(report, sort_keys=True))


def _settled(state: tuple[str, str | None, int]) -> bool:
    status, reason, _ = state
    if status == "completed":
        return True
    if status in ("paused", "blocked"):
        return reason in SETTLED_REASONS
    return False


def bench_chaos(config: ChaosConfig, echo: Callable[[str], None]) -> dict[str, Any]:
    return Chaos(config, echo).run()
