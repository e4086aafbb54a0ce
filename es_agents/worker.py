"""The worker: owns partitions of ``es.commands``, so it owns their runs, and drives
each run's loop under the step protocol.

Per step: the intention is appended and acknowledged before the action starts; the
outcome is appended together with the next step's intention (one acknowledgement per
step) and always before any action that follows from it. A run's loop ends at an
interrupt or a terminal event and the worker forgets the run: a paused run is a row in
the log (and a timer row when it sleeps), not a thread.

Runs progress concurrently on a thread pool, one thread per active run, so a slow
model call never blocks other runs of the partition. No Kafka transaction is held
across a model or tool call.

One run's failure is that run's alone: whatever its planner, model, tools or fold do
wrong ends it as ``run_failed`` with the kind, and a run that cannot even be loaded is
quarantined in this process (its commands refused with the reason). Only the log or
the database being unreachable stops the process (crash-only: a supervisor restarts
it and the step protocol resumes every run).

Each agent's workers form their own consumer group (``PREFIX.workers.AGENT``) on the
shared commands topic, and apply only the commands of their agent's runs.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from es_agents.ack_journal import AckJournal
from es_agents.adapters.fencing import PartitionWriter
from es_agents.adapters.kafka import DeadLetterQueue, KafkaEventLog, KafkaSource
from es_agents.adapters.postgres import (
    Database,
    PostgresEffectLedger,
    PostgresTimers,
    next_epoch,
)
from es_agents.adapters.postgres_commands import Decided, PostgresCommandBook
from es_agents.agent import Agent, code_revision, declared_gates
from es_agents.app import build_claim_check
from es_agents.core.commands import Command, FireTimer, StartRun
from es_agents.core.events import Event, Interrupted, RunFailed
from es_agents.core.fold import fold
from es_agents.core.snapshot import REDUCER_VERSION
from es_agents.core.state import RunState, Versions
from es_agents.core.step import canonical_json
from es_agents.core.versions import StateMigration, VersionPolicy
from es_agents.crash import CrashPoints
from es_agents.errors import (
    AppendError,
    DecodeError,
    EsAgentsError,
    FencedError,
    PayloadUnavailable,
    RunError,
    Unavailable,
)
from es_agents.ports import Position
from es_agents.resume import RunLoader
from es_agents.run_loop import RunLoop
from es_agents.settings import Settings

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 5.0


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
        self.claims = build_claim_check(settings)
        self.log = KafkaEventLog(
            kafka, restore=self.claims.restore if self.claims else None
        )
        self.dlq = DeadLetterQueue(kafka, self.log.link)
        self.db = Database(settings.database_url.get_secret_value())
        self.db.migrate()
        self.ledger = PostgresEffectLedger(self.db)
        self.timers = PostgresTimers(self.db)
        self.book = PostgresCommandBook(self.db, kafka.topic_prefix)
        self.gates = declared_gates(agent)
        self._worker_id = uuid.uuid4().hex
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
        # Runs of other agents seen starting here, and runs this process cannot
        # load (their commands are refused with the reason), both bounded.
        self._others: OrderedDict[str, str] = OrderedDict()
        self._quarantined: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()
        self._actors: dict[str, RunActor] = {}
        self._recovering: deque[int] = deque()
        self._busy_recoveries = 0
        self._assigned = False
        self._group = group_id or f"{kafka.topic_prefix}.workers.{agent.name}"
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
        last_heartbeat = 0.0
        try:
            while not self._stop.is_set():
                if time.monotonic() - last_heartbeat > HEARTBEAT_SECONDS:
                    self._heartbeat()
                    last_heartbeat = time.monotonic()
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

    def _heartbeat(self) -> None:
        """Tell clients this agent is served, and which gates it has."""
        self.book.serve(
            self._worker_id,
            self.agent.name,
            self.running.agent_version,
            None if self.gates is None else sorted(self.gates),
            sorted(self.agent.tools),
            self._group,
        )

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
        """Commit what was applied. A commit the group refuses because it moved on
        (a rebalance) is not an error: the partition's next owner reads those
        commands again, and applying a command twice is a no-op (command ids). A
        broker out of reach raises (crash-only)."""
        offsets = self.tracker.to_commit()
        if offsets and self.source.commit_offsets(offsets):
            self.tracker.committed(offsets)

    def close(self) -> None:
        with self._lock:
            for actor in self._actors.values():
                actor.stopping = True
        self._pool.shutdown(wait=True)
        try:
            self._commit()
            with contextlib.suppress(Unavailable):  # going down with the database
                self.book.retire(self._worker_id, self.agent.name)
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
                try:
                    fold(state, event)
                except EsAgentsError as e:
                    log.error(  # noqa: TRY400 - the reason is in the message
                        "%s[%d]: run %s does not fold: %s",
                        topic,
                        partition,
                        event.run_id,
                        e,
                    )
                    state.status = "failed"  # quarantined when a command comes
            running = [
                s.run_id
                for s in states.values()
                if s.status in ("running", "blocked") and s.agent == self.agent.name
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
                "SELECT run_id FROM runs WHERE partition = %s AND agent = %s "
                "AND status IN ('running', 'blocked')",
                (partition, self.agent.name),
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
        if isinstance(command, StartRun) and command.agent != self.agent.name:
            self._remember(self._others, command.run_id, command.agent)
            self._skip(partition, offset)  # that agent's own workers start it
            return
        if command.run_id in self._others:
            self._skip(partition, offset)
            return
        reason = self._quarantined.get(command.run_id)
        if reason is not None:
            self._refuse_now(command, partition, offset, reason)
            return
        actor = self._actor(command.run_id, partition)
        with self._lock:
            actor.inbox.append((command, offset))
        self._activate(actor)

    def _skip(self, partition: int, offset: int) -> None:
        self.tracker.done(partition, offset)

    @staticmethod
    def _remember(table: OrderedDict[str, str], run_id: str, value: str) -> None:
        table[run_id] = value
        table.move_to_end(run_id)
        while len(table) > 100_000:
            table.popitem(last=False)

    def start_agent(self, run_id: str) -> str | None:
        """The agent a run's start named, when this worker or the client saw it."""
        agent = self._others.get(run_id)
        if agent is not None:
            return agent
        for verdict in self.book.for_run(run_id):
            if verdict.type == StartRun.wire_name and verdict.status != "refused":
                return verdict.agent
        return None

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
            loop: RunLoop | None = None
            failure: tuple[str, str] | None = None
            unreadable: PayloadUnavailable | None = None
            try:
                loop = RunLoop(self, actor)
                loop.drive()
            except FencedError as e:
                # Another worker owns the partition now: stop writing, keep serving
                # the rest. Its commands were not committed; the owner gets them.
                log.warning("run %s: %s", actor.run_id, e)
                self._forget(actor)
                return
            except (Unavailable, AppendError):
                raise  # the log or the database is gone: crash-only, see _guard
            except PayloadUnavailable as e:
                failure = ("payload_unavailable", str(e))
                unreadable = e
            except RunError as e:
                failure = (e.kind, str(e))
            except Exception as e:  # one run's bug is that run's alone
                if _infrastructure(e):  # a driver's error no adapter translated
                    raise Unavailable(f"run {actor.run_id}: {e!r}") from e
                log.exception("run %s: unexpected error", actor.run_id)
                kind = "reducer_error" if loop is None else "worker_error"
                failure = (kind, f"{type(e).__name__}: {e}")
            if unreadable is not None:
                try:
                    self._contain_payload(actor, loop, unreadable)
                except FencedError as e:
                    log.warning("run %s: %s", actor.run_id, e)
                    self._forget(actor)
                    return
            elif failure is not None and not self._contain(actor, loop, *failure):
                return
            with self._lock:
                if actor.stopping or not (actor.inbox or actor.wake):
                    actor.active = False
                    if not actor.inbox and self._actors.get(actor.run_id) is actor:
                        del self._actors[actor.run_id]
                    return
                actor.wake = False

    def _contain_payload(
        self, actor: RunActor, failed: RunLoop | None, error: PayloadUnavailable
    ) -> None:
        """A claim-checked payload the run needs cannot be read: pause the run with
        reason ``payload_unavailable`` (its position is known without payloads)."""
        log.warning("run %s: %s", actor.run_id, error)
        loop = RunLoop(self, actor, restore=False)
        if failed is not None:
            loop.applied = failed.applied
        loop.apply_commands()  # deciding needs no payload; stepping does
        state = loop.state
        if state is None or state.status != "running":
            loop.flush()
            return
        loop.add(
            Interrupted,
            reason="payload_unavailable",
            detail_json=canonical_json(
                {
                    "run_id": error.run_id or actor.run_id,
                    "step": error.step,
                    "key": error.key,
                    "error": str(error),
                    "resolve": "restore the object, then "
                    "es-agents provide-input RUN --by NAME --input '{}'",
                }
            ),
        )
        loop.flush()

    def _contain(
        self, actor: RunActor, loop: RunLoop | None, kind: str, reason: str
    ) -> bool:
        """End the run with its failure; False when this worker must let it go."""
        try:
            self._end_run(actor, loop, kind, reason)
        except FencedError as e:
            log.warning("run %s: %s", actor.run_id, e)
            self._forget(actor)
            return False
        except (Unavailable, AppendError):
            raise
        except Exception as e:
            if _infrastructure(e):
                raise Unavailable(f"run {actor.run_id}: {e!r}") from e
            log.exception("run %s: cannot record its failure", actor.run_id)
            self._quarantine(actor, f"run {actor.run_id} cannot be failed: {e}")
            if loop is not None:
                for offset in loop.applied:
                    self._skip(actor.partition, offset)
        return True

    def _forget(self, actor: RunActor) -> None:
        with self._lock:
            actor.stopping = True
            actor.active = False
            if self._actors.get(actor.run_id) is actor:
                del self._actors[actor.run_id]

    def _end_run(  # noqa: PLR0912 - one branch per way a failure is kept
        self, actor: RunActor, failed: RunLoop | None, kind: str, reason: str
    ) -> None:
        """Record ``run_failed`` (kind, reason) for a run that cannot go on.

        The run is loaded afresh from the log (the failed loop's state may be half
        folded); what the failed loop had buffered and folded without error -- the
        commands it applied, the completion it received -- is kept when it still
        follows the log, so a billed model call is not lost.
        """
        log.warning("run %s failed (%s): %s", actor.run_id, kind, reason)
        try:
            loop = RunLoop(self, actor)
        except (FencedError, Unavailable, AppendError):
            raise
        except Exception as e:
            if _infrastructure(e):
                raise Unavailable(f"run {actor.run_id}: {e!r}") from e
            self._quarantine(actor, f"run {actor.run_id} cannot be loaded: {e}")
            if failed is not None:
                self._refuse_applied(failed, actor, f"run failed ({kind}): {reason}")
                for offset in failed.applied:
                    self._skip(actor.partition, offset)
            return
        kept: list[Event] = []
        base = loop.state if loop.state is not None else RunState(actor.run_id)
        if (
            failed is not None
            and failed.buffer
            and failed.buffer[0].seq == base.seq + 1
        ):
            candidate = copy.deepcopy(base)
            try:
                for event in failed.buffer:
                    fold(candidate, event)
            except EsAgentsError:
                pass
            else:
                kept, base = list(failed.buffer), candidate
        if failed is not None:
            loop.applied = failed.applied
            if kept:
                loop.verdicts = failed.verdicts
            else:
                self._refuse_applied(failed, actor, f"run failed ({kind}): {reason}")
                failed.verdicts = []
        if base.seq < 0 or base.terminal:
            loop.state = None
            loop.flush()  # nothing to record; the commands' offsets are done
            return
        loop.state, loop.buffer = base, kept
        loop.add(RunFailed, error=f"{kind}: {reason}"[:4000], kind=kind)
        loop.flush()

    def _refuse_applied(self, failed: RunLoop, actor: RunActor, reason: str) -> None:
        """Commands whose events were never made durable: refused, with the reason."""
        self.book.decided(
            [Decided(v.command, "refused", reason) for v in failed.verdicts]
        )

    def _quarantine(self, actor: RunActor, reason: str) -> None:
        log.error("%s; its commands are refused until this worker restarts", reason)
        self._remember(self._quarantined, actor.run_id, reason)
        with self._lock:
            pending = list(actor.inbox)
            actor.inbox.clear()
        for command, offset in pending:
            self._refuse_now(command, actor.partition, offset, reason)

    def _refuse_now(
        self, command: Command, partition: int, offset: int, reason: str
    ) -> None:
        self.dlq.send_command(
            command.run_id,
            self.log.codec.encode(command),
            Position(self.settings.kafka.commands_topic, partition, offset),
            f"refused: {reason}",
        )
        if not isinstance(command, FireTimer):
            self.book.decided([Decided(command, "refused", reason)])
        self._skip(partition, offset)


# Errors of these libraries mean the log, the database or the object store is out of
# reach (an adapter should have said Unavailable): crash-only, never a run's failure.
_DRIVERS = frozenset(
    {"confluent_kafka", "cimpl", "psycopg", "psycopg_pool", "botocore"}
)


def _infrastructure(error: BaseException) -> bool:
    module = type(error).__module__.split(".")[0]
    return module in _DRIVERS or isinstance(error, OSError)
