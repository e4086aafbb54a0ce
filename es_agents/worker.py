"""The worker: owns partitions of ``es.commands``, so it owns their runs, and drives
each run's loop under the step protocol.

Per step: the intention is appended and acknowledged before the action starts; the
outcome is appended together with the next step's intention (one acknowledgement per
step) and always before any action that follows from it. A run's loop ends at an
interrupt or a terminal event and the worker forgets the run: a paused run is a row in
the log (and a timer row when it sleeps), not a thread.

Runs progress concurrently on a thread pool, one thread per active run, so a slow
model call never blocks other runs of the partition. No Kafka transaction is held
across a model or tool call: appends are plain idempotent writes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import JsonValue

from es_agents.ack_journal import AckJournal
from es_agents.adapters.fencing import PartitionWriter
from es_agents.adapters.kafka import DeadLetterQueue, KafkaEventLog, KafkaSource
from es_agents.adapters.postgres import (
    Database,
    PostgresEffectLedger,
    PostgresTimers,
    next_epoch,
)
from es_agents.agent import Agent, code_revision
from es_agents.core.commands import Command, FireTimer, StartRun
from es_agents.core.events import (
    Event,
    Interrupted,
    Migrated,
    ModelCallRequested,
    ModelResponded,
    Resumed,
    RunCompleted,
    RunFailed,
    StatePatched,
    ToolCallRequested,
    ToolReturned,
)
from es_agents.core.fold import fold
from es_agents.core.snapshot import REDUCER_VERSION
from es_agents.core.state import PendingModelCall, PendingToolCall, RunState, Versions
from es_agents.core.step import (
    CallModel,
    CallTool,
    EventBuilder,
    Fail,
    Finish,
    Interrupt,
    PatchState,
    Refused,
    canonical_json,
    decide,
    messages_hash,
    pass_gate,
    start,
    timer_id,
)
from es_agents.core.versions import (
    Migrate,
    Refuse,
    StateMigration,
    VersionPolicy,
    fingerprint,
    gate,
)
from es_agents.crash import CrashPoints
from es_agents.errors import (
    AppendError,
    DecodeError,
    EsAgentsError,
    FencedError,
    RetryableToolError,
    TerminalToolError,
    Unavailable,
)
from es_agents.models import Completion
from es_agents.resume import RunLoader
from es_agents.settings import Settings
from es_agents.tools import Lookup, Tool, ToolContext

log = logging.getLogger(__name__)

MODEL_TRIES = 5
TOOL_TRIES = 3


class OffsetTracker:
    """Commit a command's offset only when it and every earlier one were applied."""

    def __init__(self) -> None:
        self._pending: dict[int, set[int]] = {}
        self._seen: dict[int, int] = {}
        self._committed: dict[int, int] = {}
        self._lock = threading.Lock()

    def begin(self, partition: int, offset: int) -> None:
        with self._lock:
            self._pending.setdefault(partition, set()).add(offset)
            self._seen[partition] = max(self._seen.get(partition, -1), offset)

    def done(self, partition: int, offset: int) -> None:
        with self._lock:
            self._pending.get(partition, set()).discard(offset)

    def forget(self, partitions: Sequence[int]) -> None:
        with self._lock:
            for p in partitions:
                self._pending.pop(p, None)
                self._seen.pop(p, None)
                self._committed.pop(p, None)

    def to_commit(self) -> dict[int, int]:
        """Next offsets to commit, for partitions that moved since the last commit."""
        out: dict[int, int] = {}
        with self._lock:
            for p, seen in self._seen.items():
                pending = self._pending.get(p)
                next_offset = min(pending) if pending else seen + 1
                if next_offset > self._committed.get(p, -1):
                    out[p] = next_offset
        return out

    def committed(self, offsets: dict[int, int]) -> None:
        with self._lock:
            self._committed.update(offsets)

    @property
    def in_flight(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._pending.values())


@dataclass
class RunActor:
    run_id: str
    partition: int
    inbox: deque[tuple[Command, int]] = field(default_factory=deque)
    active: bool = False
    wake: bool = False
    stopping: bool = False


class Worker:
    def __init__(
        self,
        settings: Settings,
        agent: Agent,
        *,
        group_id: str | None = None,
        instance_id: str | None = None,
        until_idle: bool = False,
        idle_seconds: float = 1.0,
        threads: int = 64,
        crash: CrashPoints | None = None,
    ) -> None:
        self.settings = settings
        self.agent = agent
        self.until_idle = until_idle
        self.idle_seconds = idle_seconds
        self.crash = crash if crash is not None else CrashPoints.from_env()
        self.journal = AckJournal(settings.ack_journal)
        kafka = settings.kafka
        self.log = KafkaEventLog(kafka)
        self.dlq = DeadLetterQueue(kafka, self.log.link)
        self.db = Database(settings.database_url.get_secret_value())
        self.db.migrate()
        self.ledger = PostgresEffectLedger(self.db)
        self.timers = PostgresTimers(self.db)
        self.loader = RunLoader(self.db, self.log, settings.projector_group_id)
        # What this worker runs: the gate compares it with what each run started under.
        declared = agent.versions()
        self.running = Versions(
            agent_version=str(declared.get("agent_version", "")),
            code_revision=code_revision(),
            prompt_hash=str(declared.get("prompt_hash", "")),
            model_id=str(declared.get("model_id", "")),
            tools_hash=str(declared.get("tools_hash", "")),
            reducer_version=REDUCER_VERSION,
        )
        self.policy: VersionPolicy = getattr(agent, "version_policy", VersionPolicy())
        self.migrations: list[StateMigration] = list(getattr(agent, "migrations", []))
        self.tracker = OffsetTracker()
        # Milliseconds per acknowledged append (one per step), for benchmarks.
        self.append_ms: deque[float] = deque(maxlen=100_000)
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="run")
        self._lock = threading.Lock()
        self._actors: dict[str, RunActor] = {}
        self._recovering: deque[int] = deque()
        self._busy_recoveries = 0
        self._assigned = False
        self._group = group_id or f"{kafka.topic_prefix}.workers"
        self._writers: dict[int, PartitionWriter] = {}
        self._epochs: dict[int, int] = {}  # fencing tokens for tools, per partition
        self._stop = threading.Event()
        self._fatal: BaseException | None = None
        self.source: KafkaSource[Command] = KafkaSource(
            kafka,
            kafka.commands_topic,
            self._group,
            self.log.codec.decode_command,
            self.dlq,
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            extra={"group.instance.id": instance_id} if instance_id else None,
        )

    # -- the main loop -----------------------------------------------------------
    def run(self) -> None:
        last_message = time.monotonic()
        last_timers = 0.0
        try:
            while not self._stop.is_set():
                received = self.source.poll(timeout=0.05)
                for partition, offset in self.source.drain_skipped():
                    self.tracker.begin(partition, offset)
                    self.tracker.done(partition, offset)
                for item in received:
                    last_message = time.monotonic()
                    self.tracker.begin(item.partition, item.offset)
                    self._route(item.message, item.partition, item.offset)
                self._start_recoveries()
                now = time.monotonic()
                if now - last_timers > 0.25:
                    self.timers.fire_due(self._fire_timer)
                    last_timers = now
                self._commit()
                if self._fatal is not None:
                    raise self._fatal
                if (
                    self.until_idle
                    and now - last_message > self.idle_seconds
                    and self._idle()
                    and self.source.caught_up()
                ):
                    log.info("worker idle: exiting")
                    return
        finally:
            self.close()

    def stop(self) -> None:
        self._stop.set()

    def _idle(self) -> bool:
        with self._lock:
            active = any(a.active for a in self._actors.values())
            recovering = bool(self._recovering) or self._busy_recoveries > 0
        return (
            self._assigned
            and not active
            and not recovering
            and (self.tracker.in_flight == 0)
        )

    def _commit(self) -> None:
        offsets = self.tracker.to_commit()
        if offsets:
            self.source.commit_offsets(offsets)
            self.tracker.committed(offsets)

    def close(self) -> None:
        with self._lock:
            for actor in self._actors.values():
                actor.stopping = True
        self._pool.shutdown(wait=True)
        try:
            self._commit()
        finally:
            self.source.close()
            self.log.close()
            self.db.close()
            self.journal.close()

    def _fire_timer(self, timer: str, run_id: str, due_at: datetime) -> None:
        self.log.send(FireTimer(run_id=run_id, timer_id=timer, due_at=due_at))

    # -- partitions ------------------------------------------------------------------
    def _on_assign(self, partitions: list[int]) -> None:
        log.info("assigned partitions %s", partitions)
        for partition in partitions:
            epoch = next_epoch(self.db, self._group, partition)
            with self._lock:
                self._epochs[partition] = epoch
        if self.settings.fencing == "transactions":
            for partition in partitions:  # fences whoever wrote these partitions
                writer = PartitionWriter(
                    self.settings.kafka, self.log.codec, self._group, partition
                )
                with self._lock:
                    self._writers[partition] = writer
        with self._lock:
            self._assigned = True
            self._recovering.extend(partitions)

    def _on_revoke(self, partitions: list[int]) -> None:
        log.info("revoked partitions %s", partitions)
        with self._lock:
            for actor in self._actors.values():
                if actor.partition in partitions:
                    actor.stopping = True
        self._commit()
        self.tracker.forget(partitions)
        with self._lock:
            writers = [self._writers.pop(p) for p in partitions if p in self._writers]
            for partition in partitions:
                self._epochs.pop(partition, None)
        for writer in writers:
            writer.close()

    def writer(self, partition: int) -> PartitionWriter:
        with self._lock:
            writer = self._writers.get(partition)
        if writer is None:
            raise FencedError(f"partition {partition} is not owned by this worker")
        return writer

    def epoch(self, partition: int) -> int:
        epoch = self.current_epoch(partition)
        if epoch is None:
            raise FencedError(f"partition {partition} is not owned by this worker")
        return epoch

    def current_epoch(self, partition: int) -> int | None:
        with self._lock:
            return self._epochs.get(partition)

    def committed_end(self, partition: int) -> int:
        """The offset after this worker's last commit on the partition (0 if none)."""
        with self._lock:
            writer = self._writers.get(partition)
        return writer.committed_end if writer is not None else 0

    def _start_recoveries(self) -> None:
        with self._lock:
            todo = list(self._recovering)
            self._recovering.clear()
            self._busy_recoveries += len(todo)
        for partition in todo:
            self._pool.submit(self._guard, self._recover_partition, partition)

    def _recover_partition(self, partition: int) -> None:
        """Resume the runs of a partition that were running when it was last owned.

        With a projection: the runs the ``runs`` table says are running, plus every
        run with events past the projector's offset (each loads in O(K) and stops at
        once if it is not running). Without one: fold the whole partition.
        """
        try:
            projected = self.loader.projected_until(partition)
            if projected > 0:
                candidates = self._running_in_projection(partition)
                for msg in self.log.read_partition(
                    self.settings.kafka.events_topic, partition, projected
                ):
                    key = msg.key()
                    if isinstance(key, bytes):
                        candidates.add(key.decode())
                for run_id in sorted(candidates):
                    self._activate(self._actor(run_id, partition))
                return
            states: dict[str, RunState] = {}
            topic = self.settings.kafka.events_topic
            for msg in self.log.read_partition(topic, partition):
                try:
                    event = self.log.codec.decode_event(msg.value() or b"")
                except DecodeError as e:
                    log.error(  # noqa: TRY400 - the reason is in the message
                        "%s[%d]: skipping undecodable event: %s", topic, partition, e
                    )
                    continue
                state = states.get(event.run_id)
                if state is None:
                    state = states[event.run_id] = RunState(run_id=event.run_id)
                fold(state, event)
            running = [
                s.run_id for s in states.values() if s.status in ("running", "blocked")
            ]
            if running:
                log.info(
                    "partition %d: resuming %d running runs", partition, len(running)
                )
            for run_id in running:
                self._activate(self._actor(run_id, partition))
        finally:
            with self._lock:
                self._busy_recoveries -= 1

    def _running_in_projection(self, partition: int) -> set[str]:
        with self.db.transaction() as conn:
            rows = conn.execute(
                "SELECT run_id FROM runs WHERE partition = %s "
                "AND status IN ('running', 'blocked')",
                (partition,),
            ).fetchall()
        return {str(r[0]) for r in rows}

    # -- runs --------------------------------------------------------------------
    def _actor(self, run_id: str, partition: int) -> RunActor:
        with self._lock:
            actor = self._actors.get(run_id)
            if actor is None or actor.stopping:
                actor = self._actors[run_id] = RunActor(run_id, partition)
            return actor

    def _route(self, command: Command, partition: int, offset: int) -> None:
        actor = self._actor(command.run_id, partition)
        with self._lock:
            actor.inbox.append((command, offset))
        self._activate(actor)

    def _activate(self, actor: RunActor) -> None:
        with self._lock:
            if actor.active:
                actor.wake = True
                return
            actor.active = True
            actor.wake = False
        self._pool.submit(self._guard, self._drive, actor)

    def _guard(self, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except BaseException as e:
            log.exception("worker task failed")
            self._fatal = e
            self._stop.set()

    def _drive(self, actor: RunActor) -> None:
        while True:
            try:
                RunLoop(self, actor).drive()
            except FencedError as e:
                # Another worker owns the partition now: stop writing, keep serving
                # the rest. Its commands were not committed; the owner gets them.
                log.warning("run %s: %s", actor.run_id, e)
                with self._lock:
                    actor.stopping = True
                    actor.active = False
                    if self._actors.get(actor.run_id) is actor:
                        del self._actors[actor.run_id]
                return
            with self._lock:
                if actor.stopping or not (actor.inbox or actor.wake):
                    actor.active = False
                    if not actor.inbox and self._actors.get(actor.run_id) is actor:
                        del self._actors[actor.run_id]
                    return
                actor.wake = False


class RunLoop:
    """One activation of one run: load, apply commands, take steps until it waits."""

    def __init__(self, worker: Worker, actor: RunActor) -> None:
        self.w = worker
        self.actor = actor
        self.agent = worker.agent
        self.buffer: list[Event] = []
        self.epoch = worker.epoch(actor.partition)  # this activation's fencing token
        # The partition's writer when this activation began: if the partition is
        # revoked (even if it comes back), this loop can append nothing more.
        self.writer = (
            worker.writer(actor.partition)
            if worker.settings.fencing == "transactions"
            else None
        )
        # Offsets of applied commands, done once their events are durable.
        self.applied: list[int] = []
        # Snapshot + at most K events (plus the projector's lag), not the whole log.
        self.state: RunState | None = worker.loader.load(
            actor.run_id, at_least=worker.committed_end(actor.partition)
        ).state

    # -- appends -------------------------------------------------------------------
    def add(self, event_type: type[Event], **fields: object) -> Event:
        if self.state is None:
            raise EsAgentsError(f"run {self.actor.run_id}: no state to add events to")
        event = EventBuilder(self.state).add(event_type, **fields)
        self.buffer.append(event)
        return event

    def flush(self) -> None:
        """Make everything buffered durable (one acknowledgement), then let the
        offsets of the commands that caused it be committed."""
        if self.buffer:
            batch, self.buffer = self.buffer, []
            for event in batch:
                self.w.crash.hit(f"before_append:{event.wire_name}")
            started = time.perf_counter()
            try:
                self._append(batch)
            except (AppendError, FencedError):
                self.state = None  # not durable: forget what we folded
                raise
            self.w.append_ms.append((time.perf_counter() - started) * 1000)
            self.w.journal.record(batch)
            for event in batch:
                self.w.crash.hit(f"after_append:{event.wire_name}")
        applied, self.applied = self.applied, []
        for offset in applied:
            self.w.tracker.done(self.actor.partition, offset)

    def _append(self, batch: list[Event]) -> None:
        epoch = self.w.current_epoch(self.actor.partition)
        if epoch is None:
            raise FencedError(
                f"partition {self.actor.partition} is not owned by this worker"
            )
        if epoch != self.epoch:
            raise FencedError(
                f"fenced: partition {self.actor.partition} was reassigned since "
                f"run {self.actor.run_id} was loaded"
            )
        if self.writer is not None:
            self.writer.append(batch)
        else:
            self.w.log.append(batch)

    # -- the loop ------------------------------------------------------------------
    def drive(self) -> None:
        while True:
            self.apply_commands()
            if self.state is not None and self.state.status in ("running", "blocked"):
                self.check_versions(self.state)
            state = self.state
            if state is None or state.status != "running" or self.actor.stopping:
                self.flush()
                return
            self.advance(state)

    def check_versions(self, state: RunState) -> None:
        """The version gate, on every activation of a running or blocked run."""
        running = self.w.running
        decision = gate(state.versions, running, self.w.policy, self.w.migrations)
        blocked = state.status == "blocked"
        if isinstance(decision, Refuse):
            if not blocked:  # a blocked run stays as it is: nothing keeps retrying
                self.add(
                    Interrupted,
                    reason="version_mismatch",
                    detail_json=canonical_json(
                        {
                            "decision": "refuse",
                            "reason": decision.reason,
                            "started": fingerprint(state.versions),
                            "running": fingerprint(running),
                            "changed": {
                                k: list(v) for k, v in decision.changed.items()
                            },
                        }
                    ),
                )
                self.flush()
            return
        if not decision.changed and not blocked:
            return  # the same code: resume verbatim, nothing to record
        if blocked:
            self.add(Resumed, reason="version_ok", by=running.agent_version)
        patches = (
            decision.migration.patch(state) if isinstance(decision, Migrate) else {}
        )
        self.add(
            Migrated,
            from_version=state.versions.agent_version,
            to_version=running.agent_version,
            changes_json=canonical_json(
                {
                    "decision": "migrate"
                    if isinstance(decision, Migrate)
                    else "verbatim",
                    "migration": decision.migration.description
                    if isinstance(decision, Migrate)
                    else None,
                    "changed": {k: list(v) for k, v in decision.changed.items()},
                    "versions": fingerprint(running),
                }
            ),
        )
        for key, value in patches.items():
            self.add(StatePatched, key=key, value_json=canonical_json(value))

    def apply_commands(self) -> None:
        """Apply every queued command. Their events become durable with the next
        append — with the intention of the step they allow, when the run goes on,
        so a resume costs one acknowledgement — and their offsets are committed
        after it."""
        w = self.w
        while True:
            with w._lock:
                item = self.actor.inbox.popleft() if self.actor.inbox else None
            if item is None:
                break
            command, offset = item
            try:
                self.apply(command)
            except Refused as e:
                self.refuse(command, offset, e)
            self.applied.append(offset)

    def refuse(self, command: Command, offset: int, reason: Refused) -> None:
        w = self.w
        log.warning(
            "refused %s for run %s: %s", command.wire_name, command.run_id, reason
        )
        w.log.link.wait(
            [
                w.log.link.produce(
                    w.dlq.topic,
                    command.run_id,
                    w.log.codec.encode(command),
                    [
                        ("es.dlq.reason", f"refused: {reason}".encode()),
                        ("es.dlq.topic", w.settings.kafka.commands_topic.encode()),
                        ("es.dlq.partition", str(self.actor.partition).encode()),
                        ("es.dlq.offset", str(offset).encode()),
                    ],
                )
            ]
        )

    def apply(self, command: Command) -> None:
        if isinstance(command, StartRun) and self.state is None:
            if command.agent != self.agent.name:
                raise Refused(
                    f"agent {command.agent!r} is not served here "
                    f"(this worker runs {self.agent.name!r})"
                )
            event = start(command, fingerprint(self.w.running))  # type: ignore[arg-type]
            self.state = fold(RunState(run_id=command.run_id), event)
            self.buffer.append(event)
            return
        if self.state is not None and self.state.agent != self.agent.name:
            raise Refused(f"run {command.run_id} belongs to agent {self.state.agent!r}")
        self.buffer.extend(decide(self.state, command))

    def advance(self, state: RunState) -> None:
        pending = state.pending
        if isinstance(pending, PendingToolCall):
            self.flush()  # reconciling may call the tool: what led here is durable
            self.reconcile(state, pending)
            return
        step = self.agent.plan(state)
        if isinstance(pending, PendingModelCall):
            if not isinstance(step, CallModel):
                raise EsAgentsError(
                    f"run {state.run_id}: a model call is pending but "
                    f"the planner asked for {type(step).__name__}"
                )
            self.call_model(state, step, attempt=pending.attempt + 1)
        elif isinstance(step, CallModel):
            self.call_model(state, step, attempt=1)
        elif isinstance(step, CallTool):
            self.call_tool(state, step)
        elif isinstance(step, PatchState):
            self.add(StatePatched, key=step.key, value_json=canonical_json(step.value))
        elif isinstance(step, Interrupt):
            self.interrupt(state, step)
        elif isinstance(step, Finish):
            self.add(RunCompleted, output_json=canonical_json(step.output))
            self.flush()
        elif isinstance(step, Fail):
            self.add(RunFailed, error=step.error, kind=step.kind)
            self.flush()

    def interrupt(self, state: RunState, step: Interrupt) -> None:
        if step.reason == "awaiting_approval" and step.gate is not None:
            out = EventBuilder(state)
            if pass_gate(state, step.gate, out):
                self.buffer.extend(out.events)
                return
        detail = {**step.detail, **({"gate": step.gate} if step.gate else {})}
        event = self.add(
            Interrupted,
            reason=step.reason,
            detail_json=canonical_json(detail),
            wake_at=step.wake_at,
        )
        if step.reason == "sleeping":
            if step.wake_at is None:
                raise EsAgentsError(f"run {state.run_id}: sleeping needs wake_at")
            # The timer row is written before the pause is durable: a crash in
            # between leaves a timer that wakes nothing, never a sleep without one.
            self.w.timers.schedule(
                timer_id(state.run_id, event.seq), state.run_id, step.wake_at
            )
        self.flush()

    # -- model steps -----------------------------------------------------------------
    def call_model(self, state: RunState, step: CallModel, attempt: int) -> None:
        model = self.agent.model
        if model is None:
            raise EsAgentsError(
                f"agent {self.agent.name} asked for a model but has none"
            )
        self.add(
            ModelCallRequested,
            step=state.step + 1,
            messages_hash=messages_hash(step.messages),
            message_count=len(step.messages),
            params_json=canonical_json({"model": model.model_id, **step.params}),
            attempt=attempt,
        )
        self.flush()  # write-ahead: the intention (and the last outcome) are durable
        completion = self._complete(step)
        self.w.crash.hit("after_action:model")
        if completion is None:
            self.add(
                RunFailed,
                error="model unavailable after retries",
                kind="model_unavailable",
            )
            self.flush()
            return
        self.add(
            ModelResponded,
            content=completion.content,
            tool_calls=completion.tool_calls,
            finish_reason=completion.finish_reason,
            usage=completion.usage,
            model_id=completion.model_id,
        )
        # The outcome goes out with the next step's intention: one ack per step.

    def _complete(self, step: CallModel) -> Completion | None:
        model = self.agent.model
        if model is None:
            return None
        for attempt in range(MODEL_TRIES):
            try:
                return model.complete(step.messages, step.params)
            except (Unavailable, RetryableToolError) as e:
                log.warning("model call failed (%s); retrying", e)
                time.sleep(min(0.2 * 2**attempt, 5))
        return None

    # -- tool steps ------------------------------------------------------------------
    def call_tool(self, state: RunState, step: CallTool) -> None:
        number = state.step + 1
        key = f"{state.run_id}:{number}"
        tool = self.agent.tools.get(step.tool)
        self.add(
            ToolCallRequested,
            step=number,
            call_id=step.call_id,
            tool=step.tool,
            args_json=canonical_json(step.args),
            idempotency_key=key,
            side_effect=tool.side_effect if tool is not None else False,
        )
        self.flush()  # write-ahead: nothing happens downstream before this is durable
        result: Any
        error: str | None
        if tool is None:
            result, error = None, f"unknown tool {step.tool!r}"
        else:
            ctx = self.context(state.run_id, number, key)
            result, error = self.invoke(tool, step.args, ctx)
        self.w.crash.hit("after_action:tool")
        if result is _UNCERTAIN:
            self.uncertain(state, key, step.tool, step.call_id)
            return
        self.add(ToolReturned, call_id=step.call_id, result_json=result, error=error)

    def context(
        self, run_id: str, step: int, key: str, attempt: int = 1
    ) -> ToolContext:
        return ToolContext(
            run_id, step, key, attempt, partition=self.actor.partition, epoch=self.epoch
        )

    def invoke(
        self,
        tool: Tool[Any],
        args: dict[str, JsonValue],
        ctx: ToolContext,
    ) -> tuple[Any, str | None]:
        """Call the tool (through the dedupe table when it needs one)."""
        ledger = self.w.ledger
        if tool.needs_dedupe_table:
            record = ledger.begin(ctx.idempotency_key, ctx.run_id, ctx.step, tool.name)
            if record.status == "done":
                return record.result_json, record.error
            if record.status == "started":
                return _UNCERTAIN, None
            self.w.crash.hit("after_claim:tool")
        try:
            result, error = self._call(tool, args, ctx)
        except FencedError:
            if tool.needs_dedupe_table:  # refused downstream: the call did not happen
                ledger.release(ctx.idempotency_key)
            raise
        if tool.needs_dedupe_table:
            ledger.finish(ctx.idempotency_key, result, error)
        return result, error

    def _call(
        self,
        tool: Tool[Any],
        args: dict[str, JsonValue],
        ctx: ToolContext,
    ) -> tuple[str | None, str | None]:
        for attempt in range(1, TOOL_TRIES + 1):
            try:
                result = canonical_json(tool(args, ctx))
            except RetryableToolError as e:
                if attempt == TOOL_TRIES:
                    return None, f"retryable error, gave up after {attempt} tries: {e}"
                time.sleep(
                    e.retry_after if e.retry_after is not None else 0.2 * attempt
                )
                continue
            except TerminalToolError as e:
                return None, str(e)
            except FencedError:
                raise  # the downstream refused our fencing token: we lost the run
            except Exception as e:
                return None, f"{type(e).__name__}: {e}"
            limit = self.w.settings.kafka.max_event_bytes
            if len(result.encode()) > limit:
                # Larger than one log record may be: the run hears of it as an error
                # instead of the worker failing its append.
                return None, (
                    f"result of {len(result.encode())} bytes exceeds the "
                    f"{limit}-byte event limit and no object store is "
                    "configured for payloads"
                )
            return result, None
        return None, "unreachable"

    def reconcile(self, state: RunState, pending: PendingToolCall) -> None:
        """A ``tool_call_requested`` with no outcome: find out what happened by key,
        and record it as ``tool_returned`` marked reconciled (or pause, uncertain)."""
        outcome = self._reconciled_outcome(state, pending)
        if outcome is not None:
            result, error = outcome
            self.add(
                ToolReturned,
                call_id=pending.call_id,
                result_json=result,
                error=error,
                reconciled=True,
            )

    def _reconciled_outcome(  # noqa: PLR0911 - one return per way of knowing
        self, state: RunState, pending: PendingToolCall
    ) -> tuple[str | None, str | None] | None:
        key = pending.idempotency_key
        resume = state.last_resume
        if resume is not None and resume.seq > pending.seq and resume.reason == "input":
            return resume.input_json, None  # a person settled an uncertain effect
        tool = self.agent.tools.get(pending.tool)
        if tool is None:
            return None, f"unknown tool {pending.tool!r}"
        ctx = self.context(state.run_id, pending.step, key, attempt=2)
        args = _args(pending.args_json)
        if not tool.side_effect:
            return self._call(tool, args, ctx)
        if tool.lookup is not None:
            found = tool.lookup(key)
            if found.status == "done":
                return canonical_json(found.result), None
            if found.status == "absent" and tool.honors_idempotency_key:
                return self._call(tool, args, ctx)
            self.uncertain(state, key, pending.tool, pending.call_id, found)
            return None
        if tool.honors_idempotency_key:
            # The downstream dedupes by key: calling again returns the first result.
            return self._call(tool, args, ctx)
        record = self.w.ledger.get(key)
        if record is None:  # the call never started: the ledger row comes first
            result, error = self.invoke(tool, args, ctx)
            if result is not _UNCERTAIN:
                return result, error
        elif record.status == "done":
            return record.result_json, record.error
        self.uncertain(state, key, pending.tool, pending.call_id)
        return None

    def uncertain(
        self,
        state: RunState,
        key: str,
        tool: str,
        call_id: str,
        found: Lookup | None = None,
    ) -> None:
        """Neither the downstream nor the ledger can tell: a person decides."""
        self.add(
            Interrupted,
            reason="uncertain_effect",
            detail_json=canonical_json(
                {
                    "idempotency_key": key,
                    "tool": tool,
                    "call_id": call_id,
                    "lookup": found.status if found is not None else None,
                    "resolve": "es-agents provide-input RUN --input '<result JSON>'",
                }
            ),
        )
        self.flush()


_UNCERTAIN: Any = object()


def _args(args_json: str) -> dict[str, JsonValue]:
    import json  # noqa: PLC0415

    value = json.loads(args_json)
    return value if isinstance(value, dict) else {"_value": value}
