"""One activation of one run: load it, apply its commands, take steps until it waits.

The step protocol lives here (DESIGN.md invariants 1-5): a step's intention is
appended and acknowledged before its action starts; its outcome goes out with the
next step's intention (one acknowledgement per step) and always before anything that
follows from it acts. Whatever one run does wrong -- its planner or model raising,
an output too large for the log, a fold that fails -- is raised as ``RunError`` and
ends that run alone (``Worker`` records it as ``run_failed`` with the kind).
"""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any

from pydantic import JsonValue

from es_agents.adapters.postgres_commands import Decided
from es_agents.core.commands import Approve, Command, FireTimer, Reject, StartRun
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
from es_agents.core.state import PendingModelCall, PendingToolCall, RunState
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
    pass_gate,
    request_hash,
    start,
    timer_id,
)
from es_agents.core.versions import Migrate, Refuse, fingerprint, gate
from es_agents.daemon_pool import DaemonPool
from es_agents.errors import (
    AppendError,
    ConfigError,
    EsAgentsError,
    FencedError,
    ModelError,
    RetryableToolError,
    RunError,
    TerminalToolError,
    Unavailable,
)
from es_agents.models import Completion, ModelClient
from es_agents.ports import Position
from es_agents.retry import retrying
from es_agents.tools import Lookup, Tool, ToolContext

if TYPE_CHECKING:
    from es_agents.worker import RunActor, Worker

log = logging.getLogger(__name__)

MODEL_TRIES = 5
TOOL_TRIES = 3
STEP_TYPES = (CallModel, CallTool, PatchState, Interrupt, Finish, Fail)


class NotMine(Exception):
    """A command for a run of another agent: that agent's workers apply it."""


class RunLoop:
    """One activation of one run: load, apply commands, take steps until it waits."""

    def __init__(self, worker: Worker, actor: RunActor, restore: bool = True) -> None:
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
        # Offsets of applied commands, done once their events are durable, and
        # the verdicts their senders wait for (written then too).
        self.applied: list[int] = []
        self.verdicts: list[Decided] = []
        # Snapshot + at most K events (plus the projector's lag), not the whole log.
        self.state: RunState | None = worker.loader.load(
            actor.run_id,
            at_least=worker.committed_end(actor.partition),
            restore=restore,
        ).state

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

    def flush(self) -> None:
        """Make everything buffered durable (one acknowledgement), then let the
        offsets of the commands that caused it be committed."""
        if self.buffer:
            claims = self.w.claims
            if claims is not None:  # large payloads to the object store first
                self.buffer = [claims.claim(e) for e in self.buffer]
            self._check_sizes()
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
        verdicts, self.verdicts = self.verdicts, []
        self.w.book.decided(verdicts)
        applied, self.applied = self.applied, []
        for offset in applied:
            self.w.tracker.done(self.actor.partition, offset)

    def _check_sizes(self) -> None:
        """An event the log would refuse ends the run, before anything of the batch
        is appended; the events before it stay buffered for the failure record."""
        limit = self.w.settings.kafka.max_event_bytes
        for i, event in enumerate(self.buffer):
            if _text_size(event) * 4 + 4096 < limit:
                continue  # far below the limit even as 4-byte UTF-8: no encoding
            size = len(self.w.log.codec.encode(event))
            if size > limit:
                self.buffer = self.buffer[:i]
                raise RunError(
                    "oversized_output",
                    f"{event.wire_name} of {size} bytes exceeds the {limit}-byte "
                    "event limit",
                )

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
            except NotMine:
                pass  # no verdict: the run's own agent gives it
            except Refused as e:
                self.refuse(command, offset, e)
            else:
                if not isinstance(command, FireTimer):
                    self.verdicts.append(Decided(command, "applied"))
            self.applied.append(offset)

    def refuse(self, command: Command, offset: int, reason: Exception) -> None:
        """Refused: to ``es.dlq`` with the reason, and the verdict for its sender."""
        w = self.w
        log.warning(
            "refused %s for run %s: %s", command.wire_name, command.run_id, reason
        )
        w.dlq.send_command(
            command.run_id,
            w.log.codec.encode(command),
            Position(w.settings.kafka.commands_topic, self.actor.partition, offset),
            f"refused: {reason}",
        )
        if not isinstance(command, FireTimer):
            w.book.decided([Decided(command, "refused", str(reason))])

    def apply(self, command: Command) -> None:
        """Apply one command to the run, or raise ``Refused`` / ``NotMine``."""
        mine = self.agent.name
        if isinstance(command, StartRun) and self.state is None:
            if command.agent != mine:
                raise NotMine
            event = start(command, fingerprint(self.w.running))  # type: ignore[arg-type]
            self.state = fold(RunState(run_id=command.run_id), event)
            self.buffer.append(event)
            return
        if self.state is None:
            # A run this agent never started: another agent's run whose start is
            # not applied yet, or no run at all.
            if self.w.start_agent(command.run_id) not in (None, mine):
                raise NotMine
            raise Refused(f"unknown run {command.run_id}")
        if self.state.agent != mine:
            raise NotMine
        gates = self.w.gates
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
        try:
            self.buffer.extend(decide(self.state, command))
        except Refused:
            raise
        except EsAgentsError as e:
            raise RunError("reducer_error", f"{command.wire_name}: {e}") from e

    def advance(self, state: RunState) -> None:
        pending = state.pending
        if isinstance(pending, PendingToolCall):
            self.flush()  # reconciling may call the tool: what led here is durable
            self.reconcile(state, pending)
            return
        step = self._plan(state)
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
                raise RunError("planner_error", "Interrupt('sleeping') needs wake_at")
            # The timer row is written before the pause is durable: a crash in
            # between leaves a timer that wakes nothing, never a sleep without one.
            self.w.timers.schedule(
                timer_id(state.run_id, event.seq), state.run_id, step.wake_at
            )
        self.flush()

    # -- model steps -----------------------------------------------------------------
    def call_model(self, state: RunState, step: CallModel, attempt: int) -> None:
        """Request (durable), call, record. Each retry of the call is requested
        again first (``attempt`` + 1), so every call the model saw is in the log."""
        model = self.agent.model
        if model is None:
            raise RunError(
                "planner_error",
                f"agent {self.agent.name} asked for a model but has none",
            )
        policy = retrying(MODEL_TRIES, on=(Unavailable, RetryableToolError))
        try:
            for tried in policy:
                # The request is outside the retried block: only the model's own
                # failures are retried, never the log's or the database's.
                number = attempt + tried.retry_state.attempt_number - 1
                self._request(state, step, model.model_id, number)
                with tried:
                    completion = self._complete(model, step)
        except Unavailable as e:
            raise RunError(
                "model_unavailable", f"{e} (gave up after {MODEL_TRIES} tries)"
            ) from e
        except RetryableToolError as e:  # e.g. an answer that does not parse
            raise RunError(
                "model_error", f"{e} (gave up after {MODEL_TRIES} tries)"
            ) from e
        self.w.crash.hit("after_action:model")
        self.add(
            ModelResponded,
            content=completion.content,
            tool_calls=completion.tool_calls,
            finish_reason=completion.finish_reason,
            usage=completion.usage,
            model_id=completion.model_id,
        )
        # The outcome goes out with the next step's intention: one ack per step.

    def _request(
        self, state: RunState, step: CallModel, model_id: str, attempt: int
    ) -> None:
        self.add(
            ModelCallRequested,
            step=state.step + 1,
            messages_hash=request_hash(step, model_id),
            message_count=len(step.messages),
            params_json=canonical_json({"model": model_id, **step.params}),
            attempt=attempt,
        )
        self.flush()  # write-ahead: the intention (and the last outcome) are durable

    def _complete(self, model: ModelClient, step: CallModel) -> Completion:
        """One call. ``Unavailable`` and ``RetryableToolError`` are retried by the
        caller; a refusal or a client bug ends the run (``model_error``)."""
        try:
            completion = model.complete(step.messages, step.params, step.tools)
        except (Unavailable, RetryableToolError) as e:
            log.warning("run %s: model call failed (%s)", self.actor.run_id, e)
            raise
        except (ModelError, ConfigError) as e:
            raise RunError("model_error", f"model refused the call: {e}") from e
        except Exception as e:
            raise RunError("model_error", f"{type(e).__name__}: {e}") from e
        if not isinstance(completion, Completion):
            raise RunError(
                "model_error",
                f"model returned {type(completion).__name__}, not a Completion",
            )
        return completion

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
            self.uncertain(state, key, step.tool, step.call_id, why=error)
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
        if tool.needs_dedupe_table and result is not _UNCERTAIN:
            ledger.finish(ctx.idempotency_key, result, error)
        return result, error

    def _call(  # noqa: PLR0911 - one return per outcome of a call
        self,
        tool: Tool[Any],
        args: dict[str, JsonValue],
        ctx: ToolContext,
    ) -> tuple[str | None, str | None]:
        try:
            for tried in retrying(TOOL_TRIES, on=(RetryableToolError,), maximum=2.0):
                with tried:
                    result = canonical_json(self._run_tool(tool, args, ctx))
        except _TimedOut:
            if tool.side_effect:  # it may still happen: a person decides
                return _UNCERTAIN, f"timed out after {tool.timeout} s"
            return None, f"timed out after {tool.timeout} s"
        except RetryableToolError as e:
            return None, f"retryable error, gave up after {TOOL_TRIES} tries: {e}"
        except TerminalToolError as e:
            return None, str(e)
        except FencedError:
            raise  # the downstream refused our fencing token: we lost the run
        except Exception as e:
            return None, f"{type(e).__name__}: {e}"
        limit = self.w.settings.kafka.max_event_bytes
        if self.w.claims is None and len(result.encode()) > limit:
            # Larger than one log record may be: the run hears of it as an error
            # instead of the worker failing its append.
            return None, (
                f"result of {len(result.encode())} bytes exceeds the "
                f"{limit}-byte event limit and no object store is "
                "configured for payloads"
            )
        return result, None

    def _run_tool(
        self, tool: Tool[Any], args: dict[str, JsonValue], ctx: ToolContext
    ) -> JsonValue:
        """Call the tool on a daemon thread, waiting at most its timeout.

        A call past its timeout keeps its thread (Python cannot stop one); daemon
        threads never keep the worker from exiting.
        """
        if tool.timeout is None:
            return tool(args, ctx)
        future = _TOOL_THREADS.submit(lambda: tool(args, ctx))
        try:
            result: JsonValue = future.result(tool.timeout)
        except FutureTimeout as e:
            log.warning(
                "run %s: tool %s timed out after %s s",
                ctx.run_id,
                tool.name,
                tool.timeout,
            )
            raise _TimedOut from e
        return result

    def reconcile(self, state: RunState, pending: PendingToolCall) -> None:
        """A ``tool_call_requested`` with no outcome: find out what happened by key,
        and record it as ``tool_returned`` marked reconciled (or pause, uncertain)."""
        outcome = self._reconciled_outcome(state, pending)
        if outcome is not None and outcome[0] is _UNCERTAIN:
            self.uncertain(
                state,
                pending.idempotency_key,
                pending.tool,
                pending.call_id,
                why=outcome[1],
            )
        elif outcome is not None:
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

    def uncertain(  # noqa: PLR0917 - what a person needs to settle it
        self,
        state: RunState,
        key: str,
        tool: str,
        call_id: str,
        found: Lookup | None = None,
        why: str | None = None,
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
                    "why": why,
                    "resolve": "es-agents provide-input RUN --input '<result JSON>'",
                }
            ),
        )
        self.flush()


_UNCERTAIN: Any = object()
_TOOL_THREADS = DaemonPool("tool")


def _text_size(event: Event) -> int:
    """Characters of an event's text fields (tool calls included)."""
    total = 0
    for value in event.__dict__.values():
        if isinstance(value, str):
            total += len(value)
        elif isinstance(value, tuple):
            total += sum(len(str(item)) for item in value)
    return total


class _TimedOut(Exception):
    pass


def _args(args_json: str) -> dict[str, JsonValue]:

    value = json.loads(args_json)
    return value if isinstance(value, dict) else {"_value": value}
