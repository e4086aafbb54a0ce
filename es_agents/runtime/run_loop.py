"""One activation of one run: load it, apply its commands, take steps until it waits.

The step protocol: a step's intention is appended and acknowledged before its action
starts; its outcome is appended (with the next step's intention, when the planner
asks for one: one acknowledgement per step) before the planner reads it or anything
that follows from it acts. Appends go through the partition's driver, which batches
the appends of every run of the partition that is ready at once. Whatever one run
does wrong -- its planner or model raising, an output too large for the log, a fold
that fails -- is raised as ``RunError`` and ends that run alone (the worker records
it as ``run_failed`` with the kind).

A loop is a coroutine on the worker's event loop; its blocking calls (the ports)
run on ``ctx.io``. It sees the world through a ``RunContext``, never the worker.
Tool steps are in ``effects``, model steps in ``model_steps``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime
from typing import Any

from es_agents import lifecycle
from es_agents.core.approvals import escalation
from es_agents.core.budget import (
    BUDGET_EXCEEDED,
    BUDGET_KEY,
    DEFAULT_BUDGET,
    Budget,
    for_run,
    parse_overrides,
)
from es_agents.core.chain import GENESIS, Sealed
from es_agents.core.commands import (
    Approve,
    Command,
    FireTimer,
    ForkRun,
    Reject,
    StartRun,
)
from es_agents.core.events import (
    Event,
    Interrupted,
    RunCompleted,
    RunFailed,
    StatePatched,
    ToolReturned,
)
from es_agents.core.flow import FLOW_KEY
from es_agents.core.fold import fold
from es_agents.core.fork import fork_events
from es_agents.core.gate import gate_events
from es_agents.core.state import (
    AWAITING_CHILDREN,
    CHILD_LOOKUP_AFTER,
    PendingModelCall,
    PendingToolCall,
    RunState,
)
from es_agents.core.step import (
    CallModel,
    CallTool,
    CallTools,
    Decline,
    EventBuilder,
    Fail,
    Finish,
    Interrupt,
    PatchState,
    Refused,
    Respond,
    canonical_json,
    decide,
    pass_gate,
    start,
    timer_id,
)
from es_agents.core.versions import fingerprint
from es_agents.errors import (
    AppendError,
    ConfigError,
    EsAgentsError,
    FencedError,
    PayloadUnavailable,
    RunError,
)
from es_agents.ports import Decided, Position
from es_agents.runtime import children, effects, flow, model_steps, proofs
from es_agents.runtime.context import NotMine, RunActor, RunContext
from es_agents.vault import encrypted

log = logging.getLogger(__name__)

ENDS = (RunCompleted, RunFailed)
# Refused decisions recorded as events per pause; later ones only in the ledger.
REFUSALS_LOGGED = 10

STEP_TYPES = (
    CallModel,
    CallTool,
    CallTools,
    Decline,
    Respond,
    PatchState,
    Interrupt,
    Finish,
    Fail,
)


class RunLoop:
    """One activation of one run: load, apply commands, take steps until it waits."""

    def __init__(self, ctx: RunContext, actor: RunActor) -> None:
        self.ctx = ctx
        self.actor = actor
        self.agent = ctx.agent
        self.buffer: list[Event] = []
        self.epoch = ctx.owned.epoch(actor.partition)  # this activation's token
        # The partition's driver when this activation began: if the partition is
        # revoked (even if it comes back), this loop can append nothing more.
        self.driver = ctx.owned.driver(actor.partition)
        # Offsets of applied commands, done once their events are durable, and
        # the verdicts their senders wait for (written then too).
        self.applied: list[int] = []
        self.verdicts: list[Decided] = []
        self.state: RunState | None = None
        self.head = GENESIS  # the hash chain's head: the next event's prev
        self.archived: str | None = None  # a finished run's archive, rows purged
        self._flushing = asyncio.Lock()

    @classmethod
    async def open(
        cls, ctx: RunContext, actor: RunActor, restore: bool = True
    ) -> RunLoop:
        """The run loaded: snapshot + at most K events (plus the projector's lag),
        not the whole log."""
        loop = cls(ctx, actor)
        await ctx.io(loop.load, restore)
        return loop

    def load(self, restore: bool = True) -> None:
        ctx, actor = self.ctx, self.actor
        loaded = ctx.loader.load(
            actor.run_id,
            at_least=ctx.owned.committed_end(actor.partition),
            restore=restore,
        )
        self.state = loaded.state
        self.archived = loaded.archived
        if self.state is not None and ctx.encrypt and ctx.cipher is not None:
            self.state = ctx.cipher.reveal(actor.run_id, self.state, strict=True)
        self.head = loaded.head

    # -- appends -------------------------------------------------------------------
    def add(self, event_type: type[Event], **fields: object) -> Event:
        if self.state is None:
            raise EsAgentsError(f"run {self.actor.run_id}: no state to add events to")
        try:
            event = EventBuilder(self.state).add(event_type, **fields)
        except (EsAgentsError, ValueError, TypeError) as e:  # pydantic: ValueError
            raise RunError(
                "reducer_error", f"{event_type.__name__} does not fold: {e}"
            ) from e
        self.buffer.append(event)
        return event

    async def flush(self) -> None:
        """Make everything buffered durable (one acknowledgement, shared with the
        partition's other runs), then let the offsets of the commands that caused
        it be committed. Flushes of one run (its concurrent tool calls) go one
        after the other: each seals after the head the last one left."""
        async with self._flushing:
            await self._flush()

    async def _flush(self) -> None:
        ctx = self.ctx
        events, self.buffer = self.buffer, []
        if events:
            if ctx.encrypt and ctx.cipher is not None:  # then claim the ciphertext
                cipher = ctx.cipher
                events = await ctx.io(lambda: [cipher.encrypt_event(e) for e in events])
            claims = ctx.claims
            if claims is not None and any(claims.large(e) for e in events):
                # Large payloads to the object store first.
                events = await ctx.io(lambda: [claims.claim(e) for e in events])
            sealed = self._seal(events)
            batch = [s.event for s in sealed]
            for event in batch:
                ctx.probe.hit(f"before_append:{event.wire_name}")
            started = time.perf_counter()
            try:
                await self._append(sealed)
            except (AppendError, FencedError):
                self.state = None  # not durable: forget what we folded
                raise
            self.head = sealed[-1].digest
            took = time.perf_counter() - started
            ctx.append_ms.append(took * 1000)
            ctx.telemetry.append(self.agent.name, took)
            ctx.probe.acked(batch)
            lifecycle.acknowledged(self.agent.name, batch)
            for event in batch:
                ctx.probe.hit(f"after_append:{event.wire_name}")
            state = self.state
            if state is not None and state.terminal and isinstance(batch[-1], ENDS):
                told = children.on_end(state)  # the parent, and open children
                if told:
                    told = await ctx.io(children.sealed_ends, ctx, told)
                    await ctx.io(ctx.log.send_all, told)
        verdicts, self.verdicts = self.verdicts, []
        if verdicts:
            await ctx.io(ctx.book.decided, verdicts)
        applied, self.applied = self.applied, []
        for offset in applied:
            ctx.done(self.actor.partition, offset)

    def _seal(self, events: list[Event]) -> list[Sealed]:
        """``events`` chained after the run's head and encoded once. An event the
        log would refuse ends the run before anything of the batch is appended;
        the events before it stay buffered for the failure record."""
        sealed = self.ctx.log.seal(events, self.head)
        trace = self.ctx.tracer.headers()  # the current span's, beside each event
        if trace:
            sealed = [Sealed(s.event, s.value, (*s.headers, *trace)) for s in sealed]
        limit = self.ctx.max_event_bytes
        for i, record in enumerate(sealed):
            if len(record.value) > limit:
                self.buffer = events[:i] + self.buffer
                raise RunError(
                    "oversized_output",
                    f"{record.event.wire_name} of {len(record.value)} bytes exceeds "
                    f"the {limit}-byte event limit",
                )
        return sealed

    async def _append(self, batch: list[Sealed]) -> None:
        epoch = self.ctx.owned.current_epoch(self.actor.partition)
        if epoch is None:
            raise FencedError(
                f"partition {self.actor.partition} is not owned by this worker"
            )
        if epoch != self.epoch:
            raise FencedError(
                f"fenced: partition {self.actor.partition} was reassigned since "
                f"run {self.actor.run_id} was loaded"
            )
        await self.driver.append(batch)

    # -- the loop ------------------------------------------------------------------
    async def drive(self) -> None:
        """Apply the commands and take steps until the run waits. One call: one
        span in the run's trace."""
        with self.ctx.tracer.activation(self.agent.name, self.actor.run_id):
            await self._drive()

    async def _drive(self) -> None:
        gate = True  # the version gate: at the activation and after commands
        placed = False  # a place among the agent's active runs (core.flow)
        while True:
            if self.actor.inbox:
                # Applying commands may read the database (a start's agent, a
                # key, a fork's origin): off the loop, one hop for all of them.
                await self.ctx.io(self.apply_commands)
                gate = True
            if (
                gate
                and self.state is not None
                and self.state.status in ("running", "blocked")
            ):
                gate = False
                await self.check_versions(self.state)
            state = self.state
            if state is None or state.status != "running" or self.actor.stopping:
                await self.flush()
                return
            if not placed:
                placed = await flow.hold_place(self, state)
                if not placed:
                    return  # queued: a worker wakes it when a place is free
            await self.advance(state)
            if self.buffer:
                await asyncio.sleep(0)  # a step without an append: let others step

    async def check_versions(self, state: RunState) -> None:
        """The version gate, on every activation of a running or blocked run."""
        ctx = self.ctx
        decided = gate_events(state, ctx.running, ctx.policy, ctx.migrations)
        for event_type, fields in decided.events:
            self.add(event_type, **fields)
        if decided.refused and decided.events:
            await self.flush()

    def apply_commands(self) -> None:
        """Apply every queued command (blocking: called through ``ctx.io``). Their
        events become durable with the next append -- with the intention of the
        step they allow, when the run goes on, so a resume costs one
        acknowledgement -- and their offsets are committed after it."""
        while True:
            with self.ctx.lock:
                item = self.actor.inbox.popleft() if self.actor.inbox else None
            if item is None:
                break
            command, offset = item
            try:
                note = self.apply(command)
            except NotMine:
                pass  # no verdict: the run's own agent gives it
            except Refused as e:
                self.refuse(command, offset, e)
            else:
                if not isinstance(command, FireTimer):
                    self.verdicts.append(Decided(command, "applied", note))
            self.applied.append(offset)

    def refuse(self, command: Command, offset: int, reason: Exception) -> None:
        """Refused: to the DLQ with the reason, and the verdict for its sender."""
        ctx = self.ctx
        log.warning(
            "refused %s for run %s: %s", command.wire_name, command.run_id, reason
        )
        ctx.dlq.send_command(
            command.run_id,
            ctx.log.encode(command),
            Position(ctx.commands_topic, self.actor.partition, offset),
            f"refused: {reason}",
        )
        if not isinstance(command, FireTimer):
            ctx.book.decided([Decided(command, "refused", str(reason))])

    def _restored(self, command: Command) -> Command:
        """A command whose input a client stored in the object store (claim check),
        with the input read back; ``Refused`` when it cannot be."""
        if not getattr(command, "claims", ()):
            return command
        claims = self.ctx.claims
        if claims is None:
            raise Refused(
                "its input is in the object store and this worker reads none "
                "(ES_AGENTS_PAYLOADS=off)"
            )
        try:
            return claims.restore_command(command)
        except PayloadUnavailable as e:
            raise Refused(f"its input is unavailable: {e}") from e

    def _start(self, command: StartRun) -> None:
        check = getattr(self.agent, "check_input", None)  # a typed agent's
        if check is not None and (why := check(command.input_json)) is not None:
            raise Refused(why)
        own = None
        if command.budget_json is not None:
            try:
                own = parse_overrides(command.budget_json)
            except ValueError as e:
                raise Refused(str(e)) from e
        event = start(command, fingerprint(self.ctx.running))  # type: ignore[arg-type]
        self.state = fold(RunState(run_id=command.run_id), event)
        self.buffer.append(event)
        if own is not None:  # the run's own limits, in its log
            self.add(StatePatched, key=BUDGET_KEY, value_json=canonical_json(own))
        if command.tenant is not None or command.priority:  # for flow control
            place = {"tenant": command.tenant, "priority": command.priority}
            self.add(StatePatched, key=FLOW_KEY, value_json=canonical_json(place))

    def apply(self, command: Command) -> str | None:  # noqa: PLR0912 - per command
        """Apply one command to the run, or raise ``Refused`` / ``NotMine``; a note
        for its sender when it was applied but did not finish (a quorum)."""
        command = self._restored(command)
        if self.ctx.cipher is not None and encrypted(command):  # a client sealed it
            try:
                command = self.ctx.cipher.reveal(command.run_id, command, strict=True)
            except ConfigError as e:
                raise Refused(f"its payload is encrypted: {e}") from e
        mine = self.agent.name
        if self.state is None and self.archived is not None:
            raise Refused(
                f"run {command.run_id} is archived: it ended and its rows were "
                f"purged (archive {self.archived}); es-agents restore "
                f"{command.run_id} brings it back to read"
            )
        if isinstance(command, StartRun) and self.state is None:
            if command.agent != mine:
                raise NotMine
            self._start(command)
            return None
        if isinstance(command, ForkRun) and self.state is None:
            if command.agent != mine:
                raise NotMine
            self.fork(command)
            return None
        if self.state is None:
            # A run this agent never started: another agent's run whose start is
            # not applied yet, or no run at all.
            if self.ctx.start_agent(command.run_id) not in (None, mine):
                raise NotMine
            raise Refused(f"unknown run {command.run_id}")
        if self.state.agent != mine:
            raise NotMine
        gates = self.ctx.gates
        if (
            isinstance(command, Approve | Reject)
            and command.gate is not None
            and gates is not None
            and command.gate not in gates
        ):
            raise Refused(
                f"agent {mine!r} has no gate {command.gate!r} "
                f"(its gates: {', '.join(sorted(gates)) or 'none'})"
            )
        if isinstance(command, Approve | Reject):
            recorded = self.judged(self.state, command)
            if recorded is not None:
                return recorded
        if isinstance(command, FireTimer) and self.look_for_children(command):
            return None
        if isinstance(command, FireTimer) and self.ctx.escalations:
            handed = escalation(self.state, command, self.ctx.escalations)
            if handed is not None:  # the deadline passed: to the other deciders
                events, due = handed
                # Armed before the mark is durable (as a sleep's timer): a crash
                # between leaves a deadline that hands the gate over then.
                self.ctx.timers.schedule(command.timer_id, command.run_id, due)
                self.buffer.extend(events)
                return None
        try:
            self.buffer.extend(decide(self.state, command))
        except Refused:
            raise
        except EsAgentsError as e:
            raise RunError("reducer_error", f"{command.wire_name}: {e}") from e
        return None

    def look_for_children(self, command: FireTimer) -> bool:
        """A run waiting for its children, woken by its timer: the children that
        ended (read in the log) answer their calls; the timer is armed again for
        those still running. False: not such a timer."""
        state = self.state
        waiting = state.waiting if state is not None else None
        if (
            state is None
            or waiting is None
            or waiting.reason != AWAITING_CHILDREN
            or timer_id(state.run_id, waiting.since_seq) != command.timer_id
        ):
            return False
        for told in children.ended_children(self.ctx, state):
            self.buffer.extend(decide(state, told))
        if state.status == "paused":
            after = getattr(self.agent, "children_lookup", CHILD_LOOKUP_AFTER)
            due = max(command.due_at, command.at) + after
            self.ctx.timers.schedule(command.timer_id, state.run_id, due)
        return True

    def judged(self, state: RunState, command: Approve | Reject) -> str | None:
        """A decision on a gate with an approval policy: refused (recorded, then
        ``Refused``), or counted towards the quorum (a note for the sender), or one
        that resumes the run (None: ``decide`` applies it)."""
        approvals = self.ctx.approvals
        if approvals is None or command.command_id in state.command_ids:
            return None
        judged = approvals.judge(state, command)
        if judged is None:
            return None
        waiting = state.waiting
        if judged.refused is not None and (
            waiting is not None and waiting.refusals >= REFUSALS_LOGGED
        ):
            # Anyone who may send commands could grow the run's log without end:
            # past the first refusals of a pause, the verdict is the record (the
            # commands ledger keeps it), not an event.
            raise Refused(judged.refused)
        for event_type, fields in judged.events:
            self.add(event_type, **fields)
        if judged.refused is not None:
            raise Refused(judged.refused)
        return judged.note

    def fork(self, command: ForkRun) -> None:
        """This run begins as a copy of the origin's log up to ``at_seq`` (read from
        the origin's first event, payloads read back so the state is whole)."""
        ctx = self.ctx
        origin = command.origin_run
        first = ctx.loader.projections.first_offset(origin)
        sealed = ctx.log.read_sealed(
            origin, from_offset=first or 0, until_seq=command.at_seq
        )
        head = next((s.digest for s in sealed if s.event.seq == command.at_seq), b"")
        copied = [s.event for s in sealed]
        if ctx.cipher is not None and ctx.encrypt:  # the copy gets the fork's own key
            copied = [ctx.cipher.reveal(origin, e, strict=True) for e in copied]
        events, state = fork_events(copied, command, head)
        self.state = state
        self.buffer.extend(events)
        waiting = state.waiting
        if waiting is not None and waiting.wake_at is not None:  # asleep at the fork
            ctx.timers.schedule(
                timer_id(state.run_id, waiting.since_seq), state.run_id, waiting.wake_at
            )

    async def advance(self, state: RunState) -> None:
        started = time.perf_counter()
        with self.ctx.tracer.step(
            self.agent.name, state.run_id, state.step + 1
        ) as span:
            kind = await self._advance(state)
            span.set("es_agents.step.kind", kind)
        self.ctx.telemetry.step(self.agent.name, kind, time.perf_counter() - started)

    async def _advance(self, state: RunState) -> str:  # noqa: PLR0911, PLR0912 - per kind
        """Take one step; returns its kind (for metrics)."""
        pending = state.pending
        if isinstance(pending, PendingToolCall):
            await self.flush()  # reconciling may call the tool: what led here first
            if await proofs.unproven_intention(self, state, pending):
                return "interrupt"
            await effects.reconcile(self, state, pending)
            return "reconcile"
        step = self._plan(state)
        if pending is None and isinstance(step, CallModel | CallTool | CallTools):
            agents: Budget = getattr(self.agent, "budget", DEFAULT_BUDGET)
            budget = for_run(agents, state)
            # The clock only for a time limit: this runs before every call.
            now = datetime.now(UTC) if budget.max_seconds is not None else None
            cost = self.ctx.cost(state) if budget.max_cost is not None else None
            why = budget.over(state, now, model=isinstance(step, CallModel), cost=cost)
            if why is not None:
                if budget.on_exceeded == "pause":  # for a person to grant more
                    detail = canonical_json({"why": why})
                    self.add(Interrupted, reason=BUDGET_EXCEEDED, detail_json=detail)
                else:
                    self.add(RunFailed, error=why, kind=BUDGET_EXCEEDED)
                await self.flush()
                return "budget"  # es_agents_steps{kind="budget"}
        if isinstance(pending, PendingModelCall):
            if not isinstance(step, CallModel):
                raise EsAgentsError(
                    f"run {state.run_id}: a model call is pending but "
                    f"the planner asked for {type(step).__name__}"
                )
            await model_steps.call_model(self, state, step, attempt=pending.attempt + 1)
            return "model"
        if isinstance(step, CallModel):
            await model_steps.call_model(self, state, step, attempt=1)
            return "model"
        if isinstance(step, CallTool | CallTools) and await proofs.held_back(
            self, state, step
        ):
            return "interrupt"
        if isinstance(step, CallTool):
            await effects.call_tool(self, state, step)
            return "tool"
        if isinstance(step, CallTools):
            await effects.call_tools(self, state, step)
            return "tools"
        if isinstance(step, Decline):  # nothing runs: the outcome is the refusal
            self.add(ToolReturned, call_id=step.call_id, error=step.error)
            return "decline"
        if isinstance(step, Respond):  # nothing runs: the outcome is given
            result = canonical_json(step.result)
            self.add(ToolReturned, call_id=step.call_id, result_json=result)
            return "respond"
        if isinstance(step, PatchState):
            self.add(StatePatched, key=step.key, value_json=canonical_json(step.value))
            return "patch"
        if isinstance(step, Interrupt):
            await self.interrupt(state, step)
            return "interrupt"
        if isinstance(step, Finish):
            self.add(RunCompleted, output_json=canonical_json(step.output))
            await self.flush()
            return "finish"
        self.add(RunFailed, error=step.error, kind=step.kind)  # Fail
        await self.flush()
        return "fail"

    def _plan(self, state: RunState) -> Any:
        """The planner's next step; whatever it raises ends this run alone."""
        try:
            step = self.agent.plan(state)
        except Exception as e:
            raise RunError("planner_error", f"{type(e).__name__}: {e}") from e
        if not isinstance(step, STEP_TYPES):
            raise RunError(
                "planner_error", f"plan() returned {type(step).__name__}, not a step"
            )
        return step

    async def interrupt(self, state: RunState, step: Interrupt) -> None:
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
        if step.reason == "sleeping" and step.wake_at is None:
            raise RunError("planner_error", "Interrupt('sleeping') needs wake_at")
        if step.wake_at is not None:  # a sleep's end, or a decision's deadline
            # The timer row is written before the pause is durable: a crash in
            # between leaves a timer that wakes nothing, never a sleep without one.
            await self.ctx.io(
                self.ctx.timers.schedule,
                timer_id(state.run_id, event.seq),
                state.run_id,
                step.wake_at,
            )
        await self.flush()
