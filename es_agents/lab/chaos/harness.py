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
import statistics
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from pydantic import SecretStr

from es_agents.app import authenticate, build_client_ports
from es_agents.core import RunState, replay
from es_agents.core.commands import Approve, StartRun
from es_agents.core.events import Event
from es_agents.dev import DevStack
from es_agents.errors import EsAgentsError
from es_agents.lab.chaos.agent import NAME
from es_agents.lab.chaos.checks import (
    check_acks,
    check_model_calls,
    check_projection,
    print_report,
)
from es_agents.lab.chaos.cluster_faults import (
    AckClock,
    BrokerFault,
    kill_node,
    longest_stalls,
    rolling_restart,
)
from es_agents.lab.chaos.effects import EffectsService
from es_agents.lab.chaos.observers import Sender, Watcher
from es_agents.lab.chaos.processes import Child
from es_agents.lab.chaos.schedule import Fault, fault_schedule, fingerprint
from es_agents.settings import load_settings

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
        self.cluster = len(self.stack.brokers) > 1
        self.schedule = fault_schedule(
            config.seed,
            config.minutes * 60,
            config.workers,
            config.mean_gap,
            cluster=self.cluster,
        )
        base = load_settings()
        # On the Postgres store there is no broker to kill: its faults restart
        # Postgres instead (the schedule stays the seed's).
        self.store = base.store
        if self.store == "memory":
            raise EsAgentsError("bench chaos needs a store shared by processes")
        replicas, min_isr = self.stack.dev.replication
        self.kafka = base.kafka.model_copy(
            update={
                "topic_prefix": f"chaos-{self.uid}",
                "partitions": config.partitions,
                "session_timeout_ms": config.session_timeout_ms,
                "bootstrap_servers": self.stack.dev.kafka_bootstrap,
                "replication_factor": replicas,
                "min_insync_replicas": min_isr,
            }
        )
        self.broker_faults: list[BrokerFault] = []  # what each broker loss cost
        self.detail = ""  # the last fault's cost, for the timeline
        self.database = f"chaos_{self.uid}"
        self.database_url = (
            self.stack.dev.database_url.rsplit("/", 1)[0] + f"/{self.database}"
        )
        self.settings = base.model_copy(
            update={
                "kafka": self.kafka,
                "database_url": SecretStr(self.database_url),
                "ack_journal": None,
            }
        )
        self.work = self.stack.dev.root / "chaos" / self.uid
        self.effects = EffectsService()
        self.injected: Counter[str] = Counter()
        self.timeline: list[str] = []
        self.started: dict[str, float] = {}
        self.approved: dict[str, float] = {}
        self.t0 = 0.0
        self.wall_t0 = 0.0

    # -- processes -------------------------------------------------------------------
    def _env(self) -> dict[str, str]:
        env = {
            **os.environ,
            "ES_AGENTS_STORE": self.store,
            "ES_AGENTS_BOOTSTRAP_SERVERS": self.kafka.bootstrap_servers,
            "ES_AGENTS_TOPIC_PREFIX": self.kafka.topic_prefix,
            "ES_AGENTS_PARTITIONS": str(self.kafka.partitions),
            "ES_AGENTS_REPLICATION_FACTOR": str(self.kafka.replication_factor),
            "ES_AGENTS_MIN_INSYNC_REPLICAS": str(self.kafka.min_insync_replicas),
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
        self.ports = build_client_ports(self.settings)
        self.ports.migrate()
        authenticate(self.settings, self.ports)  # the writer key, now its table exists
        self.ports.ensure_topics()
        self.effects.start()
        self.workers, self.projector = self._children()
        children = [*self.workers, self.projector]
        self.echo(
            f"chaos seed {config.seed}: up to {len(self.schedule)} faults in "
            f"{config.minutes * 60:.0f} s (schedule {fingerprint(self.schedule)}), "
            f"{config.workers} workers, {config.partitions} partitions, "
            f"{config.concurrency} concurrent runs, {self.store} store; "
            f"logs in {self.work}"
        )
        for child in children:
            child.start()
        self.watcher = Watcher(
            self.ports.log, self.kafka.events_topic, self.kafka.partitions
        )
        self.sender = Sender(self.ports.log)
        self.clock = AckClock(self.work) if self.cluster else None
        try:
            self.t0 = time.monotonic()
            self.wall_t0 = time.time()
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
            if self.clock is not None:
                self.clock.close()
            self.ports.close()
            self.effects.stop()
        if report["violations"]:
            self.echo(
                f"kept database {self.database}, the topics "
                f"{self.kafka.topic_prefix}.* and the logs for inspection"
            )
        else:
            self.stack.postgres.drop_database(self.database)
            if self.store == "kafka":
                from es_agents.adapters.kafka_admin import (  # noqa: PLC0415
                    delete_topics,
                )

                delete_topics(self.kafka)
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
            kind = fault.kind
            if kind == "kill_broker" and self.store != "kafka":
                kind = "restart_postgres"  # no broker: the store's server instead
            self.injected[kind] += 1
            self.timeline.append(
                f"{at:7.1f}s {kind}"
                + (f" worker-{fault.worker}" if fault.worker >= 0 else "")
                + (f" then {fault.crash_at}" if fault.crash_at else "")
                + f" ({time.monotonic() - started:.1f} s)"
            )
            if self.detail:  # what the fault cost, when measured
                self.timeline.append(self.detail)
                self.detail = ""

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
        elif fault.kind in ("kill_broker", "kill_controller") and self.clock:
            cost = kill_node(self.stack, self.kafka, fault.kind, self.rng, self.clock)
            self.broker_faults.append(cost)
            self.detail = (
                f"{'':8}broker {cost.broker} (led {cost.led} partitions"
                f"{', the active controller' if cost.controller else ''}): "
                f"acknowledged again {cost.resumed_s:.1f} s after the kill; "
                f"{cost.rate_down:.0f}/s while down vs {cost.rate_before:.0f}/s "
                f"in the minute before ({cost.ratio:.0%})"
            )
        elif fault.kind == "rolling_restart":
            rolling_restart(self.stack, self.kafka.bootstrap_servers)
        elif fault.kind == "kill_broker" and self.store == "kafka":
            self.stack.kafka.kill(signal.SIGKILL)
            time.sleep(1.0)
            self.stack.kafka.start()
        elif fault.kind in ("restart_postgres", "kill_broker"):
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
        for node in self.stack.brokers:
            node.start()
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
        acks = check_acks(self.work, runs, violations)
        reissued = check_model_calls(self.work, runs, violations)
        check_projection(self.database_url, self.projector, states, runs, violations)

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
            "store": self.store,
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
            "brokers": len(self.stack.brokers),
            **self._stalls(runs),
            **self._broker_figures(runs),
            "violations": {k: len(v) for k, v in violations.items()},
        }
        print_report(self.echo, self.timeline, report, violations)
        return report

    def _stalls(self, runs: dict[str, list[Event]]) -> dict[str, Any]:
        """The longest stalls of runs, with when they began in the fault window
        (to be read beside the faults' times)."""
        stalls = longest_stalls(runs)
        return {
            "longest_stall_s": stalls[0].seconds if stalls else 0.0,
            "longest_stalls": [
                {
                    "s": s.seconds,
                    "run": s.run_id,
                    "after": s.after,
                    "at_s": round(s.at - self.wall_t0, 1),
                }
                for s in stalls
            ],
        }

    def _broker_figures(self, runs: dict[str, list[Event]]) -> dict[str, Any]:
        """Per broker fault, and their medians and worst (a cluster only); with the
        longest stall of a run that began while the broker was down (from a second
        before the kill: a step already waiting when it fell)."""
        costs = self.broker_faults
        if not costs:
            return {}
        faults = []
        for c in costs:
            during = longest_stalls(runs, 1, (c.at - 1, c.at + c.down_s))
            faults.append(
                {
                    **asdict(c),
                    "ratio": round(c.ratio, 2),
                    "at_s": round(c.at - self.wall_t0, 1),
                    "stall_s": during[0].seconds if during else 0.0,
                }
            )
        return {
            "broker_faults": faults,
            "broker_stall_s_max": max(f["stall_s"] for f in faults),
            "resumed_s_median": statistics.median(c.resumed_s for c in costs),
            "resumed_s_max": max(c.resumed_s for c in costs),
            "down_rate_ratio_median": round(
                statistics.median(c.ratio for c in costs), 2
            ),
            "down_rate_ratio_min": round(min(c.ratio for c in costs), 2),
        }

    def _read_log(self, violations: dict[str, list[str]]) -> dict[str, list[Event]]:
        log = self.ports.log
        runs: dict[str, list[Event]] = defaultdict(list)
        for partition in range(self.kafka.partitions):
            for record in log.read_partition(self.kafka.events_topic, partition):
                try:
                    event = log.decode_event(record.value)
                except EsAgentsError as e:
                    violations["undecodable_event"].append(str(e))
                    continue
                runs[event.run_id].append(event)
        return runs


def _settled(state: tuple[str, str | None, int]) -> bool:
    status, reason, _ = state
    if status == "completed":
        return True
    if status in ("paused", "blocked"):
        return reason in SETTLED_REASONS
    return False


def bench_chaos(config: ChaosConfig, echo: Callable[[str], None]) -> dict[str, Any]:
    return Chaos(config, echo).run()
