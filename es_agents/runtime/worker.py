"""The worker: owns partitions of the commands topic, so it owns their runs, and
drives them under the step protocol (``run_loop``).

Two threads do the work. The poll loop (the caller's thread) reads commands, routes
each to its run's inbox, fires due timers and commits applied offsets. The runtime
thread runs an event loop on which every active run is a coroutine (no thread per
run: a paused or waiting run costs a task at most, and memory stays flat in the
number of runs). A run's appends go through its partition's driver, which appends
the ready steps of all the partition's runs as one batch; blocking calls run on
bounded pools (``pools``). A run's loop ends at an interrupt or a terminal event and
the worker forgets the run: a paused run is a row in the log, not a task.

One run's failure is that run's alone (``containment``); only the log or the
database being unreachable stops the process (crash-only: a supervisor restarts it
and every run resumes). Each agent's workers form their own consumer group
(``PREFIX.workers.AGENT``) on the shared commands topic, and apply only the commands
of their agent's runs. The worker speaks to the store only through ``ports``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Coroutine, Mapping
from typing import Any

from es_agents.agent import Agent
from es_agents.core.commands import (
    ChangeSchedule,
    Command,
    FireTimer,
    ForkRun,
    StartRun,
)
from es_agents.errors import (
    AppendError,
    FencedError,
    PayloadUnavailable,
    RunError,
    Unavailable,
)
from es_agents.ports import Decided, Ports, Position
from es_agents.runtime import containment
from es_agents.runtime.context import RunActor, RunContext, retention_of
from es_agents.runtime.flow import admit_queued, releases
from es_agents.runtime.offsets import OffsetTracker
from es_agents.runtime.others import OtherRuns, remember
from es_agents.runtime.ownership import Ownership, runs_to_resume
from es_agents.runtime.retention_sweep import RetentionSweep
from es_agents.runtime.run_loop import RunLoop
from es_agents.runtime.schedules import ScheduleKeeper
from es_agents.runtime.timers import BATCH, fire_timers
from es_agents.runtime.warm_runs import WarmRuns
from es_agents.settings import Settings

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 5.0
SCHEDULE_SECONDS = 0.5  # how often due schedules are looked for
ADMIT_SECONDS = 0.5  # how often queued runs are let in, when no place was freed here
STOP_SECONDS = 60.0  # at close, how long runs may take to reach a step's end
# A crash-only exit (the log or the database out of reach) does not wait for runs:
# its partitions go to their next owner, which recovers what was in flight. Closing
# the clients gets this long; the process leaves after it whatever hangs.
CRASH_CLOSE_SECONDS = 5.0
# Partitions lost (not handed over) are held this long: their runs go on, fenced as
# ever, and the group usually gives them back once the member has joined again.
HOLD_SECONDS = 15.0


class Worker:
    """A consumer-group member driving its agent's runs. Wired by the composition
    root (``es_agents.app.build_worker``): it receives the run context, the
    partitions' ownership, the offset tracker and the record of other agents' runs."""

    def __init__(  # noqa: PLR0917 - the collaborators the composition root wires
        self,
        settings: Settings,
        agent: Agent,
        ports: Ports,
        ctx: RunContext,
        ownership: Ownership,
        tracker: OffsetTracker,
        others: OtherRuns,
        *,
        group: str,
        instance_id: str | None = None,
        until_idle: bool = False,
        idle_seconds: float = 1.0,
    ) -> None:
        self.settings = settings
        self.agent = agent
        self.ports = ports
        self.ctx = ctx
        self.ownership = ownership
        self.tracker = tracker
        self.others = others
        self.until_idle = until_idle
        self.idle_seconds = idle_seconds
        self.log = ports.log
        self.dlq = ctx.dlq
        self._group = group
        self._worker_id = uuid.uuid4().hex
        self._lock = ctx.lock
        self.warm = WarmRuns(settings.warm_runs, ownership.current_epoch)
        self.schedules = ScheduleKeeper(
            ports, agent.name, settings.kafka.topic_prefix, ctx.encrypt
        )
        # Milliseconds per acknowledged append (one per step), for benchmarks.
        self.append_ms = ctx.append_ms
        # The runtime: an event loop on a thread of its own, every run a task.
        self._loop = asyncio.new_event_loop()
        self._tasks: set[asyncio.Task[None]] = set()
        self._runtime = threading.Thread(
            target=self._loop.run_forever, daemon=True, name="es-runtime"
        )
        self._runtime.start()
        # Runs this process cannot load: their commands are refused with the
        # reason (bounded).
        self._quarantined: OrderedDict[str, str] = OrderedDict()
        self._actors: dict[str, RunActor] = {}
        self._recovering: deque[int] = deque()
        self._busy_recoveries = 0
        self._assigned = False
        self._stop = threading.Event()
        self._released = threading.Event()  # a place was freed: admit at once
        self._last = {"timers": 0.0, "schedules": 0.0, "admitted": 0.0}
        self.retention = RetentionSweep(
            ports, settings, agent.name, retention_of(agent, settings)
        )
        self._fatal: BaseException | None = None
        self.source = ports.subscribe(
            settings.kafka.commands_topic,
            group,
            ports.log.decode_command,
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
            instance_id=instance_id,
        )

    # -- the main loop -----------------------------------------------------------
    def run(self) -> None:
        """Serve until stopped (runs end their step first) or idle; on a failure
        of the log or the database, leave at once (crash-only) and raise it."""
        try:
            self._serve()
        except Exception:
            self._crash()
            raise
        except BaseException:  # Ctrl-C: as a stop
            self.close()
            raise
        self.close()

    def _serve(self) -> None:
        last_message = time.monotonic()
        last_heartbeat = 0.0
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
            held_out = self.ownership.held_out(now)
            if held_out:
                log.info("lost partitions %s not given back: let go", held_out)
                self._let_go(held_out)
            if self._tend(now):
                # Their commands are to be read before this worker can call
                # itself idle (the source's end is as of its last poll).
                last_message = now
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

    def _tend(self, now: float) -> bool:
        """Fire due timers and schedules, let queued runs in; whether any command
        was sent."""
        sent = False
        last = self._last
        if now - last["timers"] > 0.25:
            fired = self._fire_timers()
            sent = fired > 0
            if fired < BATCH:
                last["timers"] = now  # else more are due: again at once
        if now - last["schedules"] > SCHEDULE_SECONDS:
            sent = self._fire_schedules() > 0 or sent
            last["schedules"] = now
        if self._released.is_set() or now - last["admitted"] > ADMIT_SECONDS:
            self._released.clear()
            sent = self._admit() > 0 or sent
            last["admitted"] = now
        self.retention.maybe(now)
        return sent

    def stop(self) -> None:
        self._stop.set()

    def _heartbeat(self) -> None:
        """Tell clients this agent is served, and which gates it has."""
        self.ports.book.serve(
            self._worker_id,
            self.agent.name,
            self.ctx.running.agent_version,
            None if self.ctx.gates is None else sorted(self.ctx.gates),
            sorted(self.agent.tools),
            self._group,
            self.ctx.encrypt,
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
        store out of reach raises (crash-only)."""
        offsets = self.tracker.to_commit()
        if offsets and self.source.commit_offsets(offsets):
            self.tracker.committed(offsets)

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            for actor in self._actors.values():
                actor.stopping = True
        # Active runs stop at the end of their step; runs not started are left to
        # the partitions' next owner (a crash-only exit leaves at once, its
        # partitions with it).
        try:
            asyncio.run_coroutine_threadsafe(self._wind_down(), self._loop).result(
                STOP_SECONDS + 5
            )
        except (TimeoutError, RuntimeError):
            log.warning("runs did not stop in %.0f s", STOP_SECONDS)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._runtime.join(5)
        self.retention.close()
        try:
            self._commit()
            with contextlib.suppress(Unavailable):  # going down with the database
                self.ports.book.retire(self._worker_id, self.agent.name)
        finally:
            self.source.close()
            self.ownership.close()
            self.ctx.io.close()
            self.ports.close()

    def _crash(self) -> None:
        """Leave at once: runs are cancelled where they are (a crash, as far as
        the log can tell: the partitions' next owner recovers them), nothing is
        committed, and the clients get ``CRASH_CLOSE_SECONDS`` to close."""
        self._stop.set()
        log.warning("leaving at once (crash-only): runs are left to the next owner")
        for task in list(self._tasks):
            self._loop.call_soon_threadsafe(task.cancel)
        self._loop.call_soon_threadsafe(self._loop.stop)

        def close_clients() -> None:
            for close in (
                self.retention.close,
                self.ownership.close,
                self.source.close,
                self.ctx.io.close,
                self.ports.close,
            ):
                try:
                    close()
                except Exception as e:  # going down anyway
                    log.debug("closing after a crash: %s", e)

        closing = threading.Thread(target=close_clients, daemon=True, name="es-crash")
        closing.start()
        closing.join(CRASH_CLOSE_SECONDS)
        if closing.is_alive():
            log.warning("clients not closed in %.0f s: leaving", CRASH_CLOSE_SECONDS)

    async def _wind_down(self) -> None:
        tasks = set(self._tasks)
        if not tasks:
            return
        _, late = await asyncio.wait(tasks, timeout=STOP_SECONDS)
        for task in late:
            task.cancel()
        if late:
            await asyncio.wait(late, timeout=5)

    def _fire_timers(self) -> int:
        try:
            return fire_timers(self.ports.timers, self.log)
        except AppendError as e:  # the log is out of reach: crash-only (exit 4)
            raise Unavailable(f"cannot fire timers: {e}") from e

    def _fire_schedules(self) -> int:
        try:
            return self.schedules.fire()
        except AppendError as e:  # the log is out of reach: crash-only (exit 4)
            raise Unavailable(f"cannot fire schedules: {e}") from e

    def _admit(self) -> int:
        """Give free places to queued runs (flow control); the number woken."""
        flow = self.ctx.flow
        if flow is None:
            return 0
        try:
            return admit_queued(flow, self.log, self.agent.name, self.ctx.limits)
        except AppendError as e:  # the log is out of reach: crash-only (exit 4)
            raise Unavailable(f"cannot wake queued runs: {e}") from e

    async def _release(self, loop: RunLoop) -> None:
        """After an activation: a run that waits for something else, or ended,
        gives its place back, and the next queued run is let in at once."""
        flow = self.ctx.flow
        if flow is None or not releases(loop.state):
            return
        await self.ctx.io(flow.release, loop.actor.run_id)
        self._released.set()

    def _change_schedule(
        self, command: ChangeSchedule, partition: int, offset: int
    ) -> None:
        if command.agent != self.agent.name:
            self.skip(partition, offset)  # that agent's own workers apply it
            return
        why = self.schedules.change(command)
        if why is not None:
            self.refuse_now(command, partition, offset, why)
            return
        self.ports.book.decided([Decided(command, "applied")])
        self.skip(partition, offset)

    # -- partitions ------------------------------------------------------------------
    def _on_assign(self, partitions: list[int]) -> Mapping[int, int] | None:
        log.info("assigned partitions %s", partitions)
        kept, stale = self.ownership.take_back(partitions)
        if kept:
            log.info("partitions %s back after a loss: their runs went on", kept)
        if stale:
            log.info("partitions %s back, claimed by another meanwhile", stale)
            self._let_go(stale)
        # Fences whoever wrote these partitions.
        self.ownership.assign([p for p in partitions if p not in kept])
        with self._lock:
            self._assigned = True
            # Kept: their runs never stopped.
            self._recovering.extend(p for p in partitions if p not in kept)
        return None

    def _on_revoke(self, partitions: list[int]) -> None:
        log.info("revoked partitions %s", partitions)
        self._commit()
        self.tracker.forget(partitions)
        self._let_go(partitions)

    def _on_lost(self, partitions: list[int]) -> None:
        """Lost, not handed over: held (``Ownership``) for ``HOLD_SECONDS``. Their
        commands not committed are read again when they come back (applying a
        command twice is a no-op)."""
        log.info("lost partitions %s: held %.0f s", partitions, HOLD_SECONDS)
        self._commit()
        self.tracker.forget(partitions)
        self.ownership.hold(partitions, time.monotonic() + HOLD_SECONDS)

    def _let_go(self, partitions: list[int]) -> None:
        """Stop the partitions' runs at their step's end and close their writers."""
        with self._lock:
            for actor in self._actors.values():
                if actor.partition in partitions:
                    actor.stopping = True
        self.ownership.revoke(partitions)
        self.warm.drop(partitions)

    def _start_recoveries(self) -> None:
        with self._lock:
            todo = list(self._recovering)
            self._recovering.clear()
            self._busy_recoveries += len(todo)
        for partition in todo:
            self._submit(self._recover_partition(partition))

    async def _recover_partition(self, partition: int) -> None:
        """Resume the runs of a partition that were running when it was last owned."""
        try:
            runs = await self.ctx.io(
                runs_to_resume,
                self.log,
                self.ports.projections,
                self.settings.kafka.events_topic,
                partition,
                self.agent.name,
            )
            if runs:
                log.info("partition %d: resuming %d runs", partition, len(runs))
            for run_id in runs:
                self._activate(self._actor(run_id, partition))
        finally:
            with self._lock:
                self._busy_recoveries -= 1

    # -- runs --------------------------------------------------------------------
    def _actor(self, run_id: str, partition: int) -> RunActor:
        with self._lock:
            actor = self._actors.get(run_id)
            if actor is None or actor.stopping:
                actor = self._actors[run_id] = RunActor(run_id, partition)
            return actor

    def _route(self, command: Command, partition: int, offset: int) -> None:
        if isinstance(command, ChangeSchedule):
            self._change_schedule(command, partition, offset)
            return
        if isinstance(command, StartRun | ForkRun) and command.agent != self.agent.name:
            self.others.remember(command.run_id, command.agent)
            self.skip(partition, offset)  # that agent's own workers start it
            return
        if command.run_id in self.others:
            self.skip(partition, offset)
            return
        reason = self._quarantined.get(command.run_id)
        if reason is not None:
            self.refuse_now(command, partition, offset, reason)
            return
        actor = self._actor(command.run_id, partition)
        with self._lock:
            actor.inbox.append((command, offset))
        self._activate(actor)

    def skip(self, partition: int, offset: int) -> None:
        self.tracker.done(partition, offset)

    def _activate(self, actor: RunActor) -> None:
        with self._lock:
            if self._stop.is_set():
                return  # going down: the partition's next owner resumes it
            if actor.active:
                actor.wake = True
                return
            actor.active = True
            actor.wake = False
        self._submit(self._drive(actor))

    def _submit(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` as a task of the runtime (from any thread)."""
        self._loop.call_soon_threadsafe(self._start, work)

    def _start(self, work: Coroutine[Any, Any, None]) -> None:
        task = self._loop.create_task(self._guard(work))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _guard(self, work: Coroutine[Any, Any, None]) -> None:
        try:
            await work
        except asyncio.CancelledError:
            raise
        except BaseException as e:
            log.exception("worker task failed")
            self._fatal = e
            self._stop.set()

    def _fenced(self, actor: RunActor, e: FencedError) -> None:
        log.warning(
            "run %s: %s",
            actor.run_id,
            e,
            extra={"run_id": actor.run_id, "agent": self.agent.name, "event": "fenced"},
        )
        self.ports.telemetry.fenced(self.agent.name)

    async def _drive(self, actor: RunActor) -> None:
        while True:
            loop: RunLoop | None = None
            failure: tuple[str, str] | None = None
            unreadable: PayloadUnavailable | None = None
            try:
                loop = self.warm.take(actor) or await RunLoop.open(self.ctx, actor)
                await loop.drive()
                await self._release(loop)
                self.warm.keep(loop)
            except FencedError as e:
                # Another worker owns the partition now: stop writing, keep serving
                # the rest. Its commands were not committed; the owner gets them.
                self._fenced(actor, e)
                self.forget(actor)
                return
            except (Unavailable, AppendError):
                raise  # the log or the database is gone: crash-only, see _guard
            except PayloadUnavailable as e:
                failure = ("payload_unavailable", str(e))
                unreadable = e
            except RunError as e:
                failure = (e.kind, str(e))
            except Exception as e:  # one run's bug is that run's alone
                if containment.infrastructure(e):  # a driver's error not translated
                    raise Unavailable(f"run {actor.run_id}: {e!r}") from e
                log.exception("run %s: unexpected error", actor.run_id)
                kind = "reducer_error" if loop is None else "worker_error"
                failure = (kind, f"{type(e).__name__}: {e}")
            if unreadable is not None:
                try:
                    await containment.contain_payload(self.ctx, actor, loop, unreadable)
                except FencedError as e:
                    self._fenced(actor, e)
                    self.forget(actor)
                    return
            elif failure is not None:
                after = await containment.contain(self.ctx, actor, loop, *failure)
                if not self._settle(actor, after):
                    return
            if not self._again(actor):
                return

    def _settle(self, actor: RunActor, after: containment.Aftermath) -> bool:
        """Carry out what containing a failure decided; False: the run is let go."""
        if after.quarantine is not None:
            self.quarantine(actor, after.quarantine)
        for offset in after.skip:
            self.skip(actor.partition, offset)
        if after.let_go:
            self.forget(actor)
            return False
        return True

    def _again(self, actor: RunActor) -> bool:
        """After an activation: drive the run again (commands came meanwhile), or
        let it rest."""
        with self._lock:
            if actor.stopping or not (actor.inbox or actor.wake):
                actor.active = False
                if not actor.inbox and self._actors.get(actor.run_id) is actor:
                    del self._actors[actor.run_id]
                return False
            actor.wake = False
            return True

    def forget(self, actor: RunActor) -> None:
        with self._lock:
            actor.stopping = True
            actor.active = False
            if self._actors.get(actor.run_id) is actor:
                del self._actors[actor.run_id]

    def quarantine(self, actor: RunActor, reason: str) -> None:
        log.error("%s; its commands are refused until this worker restarts", reason)
        remember(self._quarantined, actor.run_id, reason)
        with self._lock:
            pending = list(actor.inbox)
            actor.inbox.clear()
        for command, offset in pending:
            self.refuse_now(command, actor.partition, offset, reason)

    def refuse_now(
        self, command: Command, partition: int, offset: int, reason: str
    ) -> None:
        self.dlq.send_command(
            command.run_id,
            self.log.encode(command),
            Position(self.settings.kafka.commands_topic, partition, offset),
            f"refused: {reason}",
        )
        if not isinstance(command, FireTimer):
            self.ports.book.decided([Decided(command, "refused", reason)])
        self.skip(partition, offset)
