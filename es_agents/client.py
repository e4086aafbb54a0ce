"""``es_agents.Client``: start, decide and look at runs from an application.

Commands are checked against what was applied -- the run as its log and projection
have it -- and against the starts waiting for a worker (``commands`` table), never
against commands a worker may have refused. A command that passes is recorded as
sent, produced, and then (by default) its worker's verdict is awaited: ``applied``,
``refused`` with the reason, or ``queued`` when no worker serves the run's agent yet
or none decided within the wait. Every read is O(K): a snapshot, the events after it,
and the log beyond the projector's offset; nothing scans a topic from its start.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime, timedelta
from typing import Literal, TypeVar

from pydantic import BaseModel

from es_agents.approvals import SigningKey
from es_agents.client_schedules import ScheduleClient
from es_agents.client_types import (
    FINISHED_OR_WAITING,
    CommandResult,
    PendingCall,
    Reply,
    RunRow,
    RunView,
    Waiting,
    as_json,
)
from es_agents.core.approvals import answered, decision_of, pause_of
from es_agents.core.budget import Budget, parse_overrides
from es_agents.core.commands import (
    Approve,
    Cancel,
    ChangeSchedule,
    Command,
    ForkRun,
    ProvideInput,
    Reject,
    SendMessage,
    StartRun,
)
from es_agents.core.events import Event
from es_agents.core.flow import InvalidLimits, check_priority, check_tenant
from es_agents.core.fold import fold
from es_agents.core.state import RunState
from es_agents.core.step import Refused, decide, last_reply, start
from es_agents.dead_letters import DeadLetter, read_dead_letters
from es_agents.errors import (
    ConfigError,
    EsAgentsError,
    InvalidInput,
    NotFound,
    PayloadUnavailable,
)
from es_agents.following import follow_run
from es_agents.history import read_runs
from es_agents.ports import (
    Decided,
    Delta,
    Ports,
    Position,
    ServedAgent,
    Verdict,
)
from es_agents.retention import Archived, Retainer
from es_agents.runtime.loader import RunLoader
from es_agents.served import served_agents
from es_agents.settings import Settings, load_settings
from es_agents.vault import Cipher

__all__ = [
    "FINISHED_OR_WAITING",
    "Client",
    "CommandResult",
    "PendingCall",
    "Reply",
    "RunRow",
    "RunView",
    "Waiting",
    "as_json",
]

# A worker writes its agent's row every 5 s: older than this, nobody serves it.
SERVED_WITHIN_SECONDS = 30.0
# How long a start refusing an unknown agent waits for a worker starting meanwhile.
SERVED_GRACE_SECONDS = 10.0
AGENT_CACHE_SECONDS = 1.0
X = TypeVar("X")
M = TypeVar("M", bound=BaseModel)
C = TypeVar("C", bound=Command)
# What a person writes into a command beside its input: sealed like the input.
FREE_TEXTS = ("args_json", "comment", "reason")


def _free_text(command: Command) -> bool:
    return any(getattr(command, name, None) for name in FREE_TEXTS)


SIGNED_FOR = timedelta(minutes=15)  # a signed decision's default validity


class Client:
    """One per application: a producer, a reader and a small Postgres pool."""

    def __init__(
        self, settings: Settings | None = None, *, ports: Ports | None = None
    ) -> None:
        self.settings = settings if settings is not None else load_settings()
        if ports is None:
            from es_agents.app import build_client_ports  # noqa: PLC0415

            ports = build_client_ports(self.settings)
        self._ports = ports
        self._log = ports.log
        self._max_command_bytes = self.settings.kafka.max_event_bytes
        self._book = ports.book
        self._loader = RunLoader(
            ports.projections, ports.log, self.settings.kafka.events_topic
        )
        self._topics_checked = False
        self._served: dict[str, tuple[float, ServedAgent]] = {}
        # With a master key, inputs are sent encrypted under the run's data key and
        # encrypted payloads are shown; without one they read "(encrypted)".
        self._seals = self.settings.master is not None
        self._cipher = Cipher(ports.vault)

    @property
    def ports(self) -> Ports:
        """The adapters this client speaks through."""
        return self._ports

    def close(self) -> None:
        self._ports.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- commands --------------------------------------------------------------------
    def start(
        self,
        agent: str,
        input_json: object = "{}",
        run_id: str | None = None,
        wait: float = 10.0,
        *,
        unserved: Literal["queue", "refuse"] = "queue",
        budget: Budget | Mapping[str, object] | None = None,
        tenant: str | None = None,
        priority: int = 0,
    ) -> CommandResult:
        """Start a run of ``agent``; refused at once if ``run_id`` is taken.

        ``tenant`` and ``priority``: for an agent with limits of active runs
        (``Limits``), whose run it is and its place in the queue when no place is
        free (higher first, then in arrival order); checked here (``InvalidInput``).

        ``budget``: the run's own limits instead of its agent's -- a ``Budget``
        (all of it), or a mapping of some of its fields (``{"max_steps": 20,
        "on_exceeded": "pause"}``); checked here (``InvalidInput``).

        ``input_json``: JSON text, or any JSON value (dict, list, number, ...), or a
        pydantic model (its JSON); anything else raises ``InvalidInput``.

        ``unserved``: what to do when no worker has ever served ``agent`` on this
        prefix -- queue the start for a worker to come (the default), or refuse it
        (after ``SERVED_GRACE_SECONDS`` for a worker that is starting), naming the
        agents that are served: a mistyped name is not queued forever."""
        text = as_json(input_json, "the run's input")
        try:
            tenant, priority = check_tenant(tenant), check_priority(priority)
        except InvalidLimits as e:
            raise InvalidInput(str(e)) from None
        self._check_topics()
        run_id = run_id or str(uuid.uuid4())
        command = self._claimed(
            StartRun(
                run_id=run_id,
                agent=agent,
                input_json=self._seal(run_id, text),
                budget_json=_budget_json(budget),
                tenant=tenant,
                priority=priority,
            )
        )
        too_large = self._too_large(command)
        if too_large is not None:
            return CommandResult(command, "refused", too_large)
        plain = self._plain_to_encrypted(agent)
        if plain is not None:
            return CommandResult(command, "refused", plain)
        if unserved == "refuse" and (unknown := self._unserved(agent)) is not None:
            return CommandResult(command, "refused", unknown)
        taken = self._book.reserve_start(command, self._known(run_id))
        if taken is not None:
            return CommandResult(command, "refused", taken)
        try:
            position = self._log.send(command)
        except EsAgentsError as e:
            # Not sent: the run id is free again (a start retried is not "pending").
            self._book.decided([Decided(command, "refused", f"not sent: {e}")])
            raise
        return self._await(command, agent, position, wait)

    def _unserved(self, agent: str) -> str | None:
        """Why ``agent`` looks unknown: no worker ever served it on this prefix,
        not even within ``SERVED_GRACE_SECONDS`` (a worker may be starting)."""
        deadline = time.monotonic() + SERVED_GRACE_SECONDS
        while self._book.agent(agent) is None:
            if time.monotonic() >= deadline:
                served = sorted({w.agent for w in self._book.workers()})
                return (
                    f"no worker has served agent {agent!r} on this prefix "
                    f"({self.settings.kafka.topic_prefix}); served: "
                    f"{', '.join(served) or 'none yet'}. Start a worker for it, or "
                    "queue the start anyway (--queue)"
                )
            time.sleep(0.2)
        return None

    def _plain_to_encrypted(self, agent: str) -> str | None:
        """Why this client may not send ``agent`` an input: the agent encrypts its
        payloads and this client, without the master key, would write the input in
        plain text to the commands topic (which never expires)."""
        if self._seals:
            return None
        served = self._book.agent(agent)
        if served is None or not served.encrypted:
            return None
        return (
            f"agent {agent!r} encrypts its runs' payloads and this client has no "
            "master key: its input (or reason, or comment) would stay in plain text "
            "in the commands topic "
            "after the run is forgotten. Set ES_AGENTS_MASTER_KEY or "
            "ES_AGENTS_MASTER_KEY_FILE"
        )

    def _claimed(self, command: C) -> C:
        """An input over the payload threshold stored in the object store, the
        command carrying its claim (as events do); as it is without a claim check."""
        claims = self._ports.claims
        return claims.claim_command(command) if claims is not None else command

    def _too_large(self, command: Command) -> str | None:
        """Why a command is larger than the log takes (None: it fits)."""
        size = len(self._log.encode(command))
        if size <= self._max_command_bytes:
            return None
        return (
            f"{command.wire_name} for run {command.run_id} is {size:,} bytes, over the "
            f"{self._max_command_bytes:,}-byte limit of a command "
            "(ES_AGENTS_MAX_EVENT_BYTES): pass a reference to the data (a URL, an "
            "object key) as the input instead of the data itself"
        )

    def fork(
        self,
        origin_run: str,
        at_seq: int,
        run_id: str | None = None,
        by: str | None = None,
        wait: float = 10.0,
    ) -> CommandResult:
        """A new run whose log begins with ``origin_run``'s events up to ``at_seq``
        (its completions kept, its effects neither reused nor repeated); the
        origin's workers make it. ``NotFound`` for an unknown origin; refused at
        once for a seq the origin has not reached, or a taken run id."""
        self._check_topics()
        found = self._loader.load(origin_run, restore=False)
        origin = found.state
        if origin is None and found.archived is not None:
            raise Refused(f"run {origin_run} is archived: restore it to fork it")
        if origin is None:
            raise NotFound(f"unknown run {origin_run}")
        command = ForkRun(
            run_id=run_id or str(uuid.uuid4()),
            agent=origin.agent,
            origin_run=origin_run,
            at_seq=at_seq,
            by=by,
        )
        if at_seq > origin.seq:
            return CommandResult(
                command,
                "refused",
                f"run {origin_run} has no seq {at_seq} (its last is {origin.seq})",
            )
        exists = run_id is not None and self._known(run_id)
        taken = self._book.reserve_start(command, exists)
        if taken is not None:
            return CommandResult(command, "refused", taken)
        position = self._log.send(command)
        return self._await(command, origin.agent, position, wait)

    def approve(
        self,
        run_id: str,
        by: str,
        gate: str | None = None,
        comment: str | None = None,
        wait: float = 10.0,
        *,
        key: SigningKey | None = None,
        valid_for: timedelta = SIGNED_FOR,
        args: object = None,
    ) -> CommandResult:
        """Approve the gate the run waits at; with ``key``, a decision signed for
        this pause and these arguments, valid for ``valid_for``. ``args``: edited
        arguments for the call the gate asks about (a JSON object as text, a dict or
        a pydantic model): the call runs with them, and a signature binds them."""
        edited = None if args is None else as_json(args, "the edited arguments")
        command = Approve(
            run_id=run_id, by=by, gate=gate, comment=comment, args_json=edited
        )
        return self._decide(command, wait, key, valid_for)

    def reject(
        self,
        run_id: str,
        by: str,
        gate: str | None = None,
        reason: str | None = None,
        wait: float = 10.0,
        *,
        key: SigningKey | None = None,
        valid_for: timedelta = SIGNED_FOR,
    ) -> CommandResult:
        command = Reject(run_id=run_id, by=by, gate=gate, reason=reason)
        return self._decide(command, wait, key, valid_for)

    def _decide(
        self,
        command: Approve | Reject,
        wait: float,
        key: SigningKey | None,
        valid_for: timedelta,
    ) -> CommandResult:
        if key is None:
            return self.send(command, wait)
        state = self._loader.load(command.run_id).state
        if state is None:
            raise NotFound(f"unknown run {command.run_id}")
        pause = pause_of(self.reveal(command.run_id, state))  # the plain arguments
        if pause is None or (command.gate not in (None, pause.gate)):
            return CommandResult(
                command,
                "refused",
                f"run {command.run_id} does not wait at "
                f"{'a gate' if command.gate is None else repr(command.gate)}: a "
                "signed decision answers the pause it is signed for",
            )
        signature, expires = key.sign(  # over the plain edited arguments, if any
            answered(pause, command), decision_of(command), command.by, valid_for
        )
        signed = command.model_copy(
            update={"key_id": key.key_id, "signature": signature, "expires_at": expires}
        )
        return self.send(signed, wait)

    def _sealed_texts(self, command: C) -> C:
        """The command's free texts (edited arguments, a comment, a reason) sealed
        under the run's data key when this client has the master key: none stays in
        plain text in the commands topic once the run is forgotten."""
        if not self._seals:
            return command
        update = {
            name: self._seal(command.run_id, value)
            for name in FREE_TEXTS
            if isinstance(value := getattr(command, name, None), str) and value
        }
        return command.model_copy(update=update) if update else command

    def provide_input(
        self, run_id: str, by: str, input_json: object, wait: float = 10.0
    ) -> CommandResult:
        """Give a run waiting for input its input: JSON text, a JSON value or a
        pydantic model, as for ``start``."""
        sealed = self._seal(run_id, as_json(input_json, "the input"))
        command = self._claimed(ProvideInput(run_id=run_id, by=by, input_json=sealed))
        too_large = self._too_large(command)
        if too_large is not None:
            return CommandResult(command, "refused", too_large)
        return self.send(command, wait)

    def send_message(
        self,
        run_id: str,
        text: str,
        by: str,
        wait: float = 10.0,
        *,
        end: bool = False,
    ) -> CommandResult:
        """The next user message of a thread (a conversational run waiting for
        one); ``end=True`` (no text): the thread ends with its last reply."""
        command = SendMessage(
            run_id=run_id, by=by, text=self._seal(run_id, text) if text else "", end=end
        )
        too_large = self._too_large(command)
        if too_large is not None:
            return CommandResult(command, "refused", too_large)
        return self.send(command, wait)

    def say(self, run_id: str, text: str, by: str, timeout: float = 120.0) -> Reply:
        """Send a thread its next message and wait for the answer to it (the run
        waits for the next message again, or ended). Raises ``Refused`` with the
        reason when the message is refused, ``TimeoutError`` past ``timeout``."""
        before = self._applied_or_pending(run_id)
        turn = (before.turns if before is not None else 0) + 1
        result = self.send_message(run_id, text, by, wait=timeout)
        if result.status == "refused":
            raise Refused(result.reason or "refused")
        return self.wait_reply(run_id, turn, timeout)

    def wait_reply(self, run_id: str, turn: int, timeout: float = 120.0) -> Reply:
        """The thread's answer to its message number ``turn`` (1: the first after
        the input; 0: the answer to the input), once the run stopped working on it."""
        waiting = Waiting(run_id, frozenset(FINISHED_OR_WAITING), timeout)
        while True:
            view = self.status(run_id)
            state = view.state
            if (
                state is not None
                and state.turns >= turn
                and view.status in waiting.wanted
            ):
                why = state.waiting.reason if state.waiting is not None else None
                return Reply(run_id, state.turns, last_reply(state), view.status, why)
            if time.monotonic() > waiting.deadline:
                raise TimeoutError(
                    f"run {run_id}: no answer to message {turn} within "
                    f"{timeout:g} s (it is {view.status})"
                )
            time.sleep(waiting.pause())

    def stream(
        self,
        run_id: str,
        timeout: float | None = None,
        cancel: threading.Event | None = None,
    ) -> Iterator[Delta]:
        """The run's model answers as they stream (``Delta``: a call's ``start``,
        pieces of ``text``, its ``end``), from the call in flight now -- what was
        sent of it so far first -- until the run stops working (it waits, or
        ended) or ``timeout`` seconds passed. A call re-issued after a crash starts
        again with a higher ``attempt``: drop what came before it. Only the
        ``model_responded`` event is the answer; deltas are what was seen on the
        way (an agent that encrypts its payloads does not stream). ``cancel``: set
        it to stop the stream from another thread."""
        deltas = self._ports.deltas
        if deltas is None:
            raise ConfigError(f"the {self._ports.store} store does not stream")
        return follow_run(deltas, self.status, run_id, timeout, cancel)

    def _seal(self, run_id: str, text: str) -> str:
        return self._cipher.encrypt_text(run_id, text) if self._seals else text

    def reveal(self, run_id: str, value: X) -> X:
        """``value`` with the run's encrypted payloads decrypted (``(forgotten)``
        once the run was forgotten, ``(encrypted)`` without the master key)."""
        return self._cipher.reveal(run_id, value)

    def forget(self, run_id: str) -> bool:
        """Destroy a finished run's data key: its payloads become unreadable
        everywhere; its payload objects no other run claims, and its archive, are
        deleted. False when it had no key (not encrypted, or forgotten before)."""
        loaded = self._loader.load(run_id, restore=False)
        state = loaded.state
        if state is None and loaded.archived is None:
            raise NotFound(f"unknown run {run_id}")
        if state is not None and not state.terminal:
            raise Refused(
                f"run {run_id} is {state.status}: cancel it before forgetting it"
            )
        self._cipher.evict(run_id)
        forgotten = self._ports.vault.forget(run_id)
        if self._ports.archives is not None and self._ports.claims is not None:
            self.retention.forget(run_id)
        return forgotten

    @property
    def retention(self) -> Retainer:
        """Archive, purge and restore finished runs (``es_agents.retention``)."""
        return Retainer(self._ports, self.settings)

    def archive(self, run_id: str, purge: bool = True) -> Archived:
        """Archive a finished run to the object store and (``purge``) delete its
        projection rows and the payload objects no other run claims."""
        return self.retention.archive(run_id, purge)

    def restore(self, run_id: str) -> int:
        """Put an archived run's events and payloads back; the events restored."""
        return self.retention.restore(run_id)

    def cancel(
        self, run_id: str, by: str, reason: str | None = None, wait: float = 10.0
    ) -> CommandResult:
        return self.send(Cancel(run_id=run_id, by=by, reason=reason), wait)

    def send(  # noqa: PLR0911 - a way per kind of command
        self, command: Command, wait: float = 10.0
    ) -> CommandResult:
        """Check a decision against the run as applied, send it, await the verdict."""
        if isinstance(command, StartRun):
            return self.start(
                command.agent, command.input_json, command.run_id, wait=wait
            )
        if isinstance(command, ForkRun):
            return self.fork(
                command.origin_run, command.at_seq, command.run_id, command.by, wait
            )
        if isinstance(command, ChangeSchedule):
            return self._deliver(command, command.agent, wait)
        self._check_topics()
        try:
            state = self._applied_or_pending(command.run_id)
        except Refused as e:  # archived
            return CommandResult(command, "refused", str(e))
        if state is None:
            raise NotFound(f"unknown run {command.run_id}")
        refusal = self._gate_refusal(state, command)
        if refusal is None and (
            isinstance(command, ProvideInput) or _free_text(command)
        ):
            refusal = self._plain_to_encrypted(state.agent)
        if refusal is not None:
            return CommandResult(command, "refused", refusal)
        try:  # judged in the plain (what this client sealed, opened again)
            plain = self.reveal(command.run_id, command) if self._seals else command
            if not decide(state, plain):
                return CommandResult(command, "applied", "already applied")
        except Refused as e:
            return CommandResult(command, "refused", str(e))
        command = self._sealed_texts(command)  # a reason, a comment: as the input
        return self._deliver(command, state.agent, wait)

    def _deliver(self, command: Command, agent: str, wait: float) -> CommandResult:
        """Send a command that was checked, and await its verdict."""
        self._check_topics()
        self._book.sent(command)
        position = self._log.send(command)
        return self._await(command, agent, position, wait)

    @property
    def schedules(self) -> ScheduleClient:
        """Runs started on a cron expression or an interval: ``set``, ``pause``,
        ``resume``, ``delete``, ``get``, ``list``."""
        return ScheduleClient(self)

    def _known(self, run_id: str) -> bool:
        """Whether the run exists (in the log, or archived)."""
        known = self._loader.load(run_id, restore=False)
        return known.state is not None or known.archived is not None

    def _applied_or_pending(self, run_id: str) -> RunState | None:
        verdicts = self._book.for_run(run_id)  # before the log: see status()
        # Deciding needs no payloads: claim-checked ones stay in the object store.
        loaded = self._loader.load(run_id, restore=False)
        if loaded.archived is not None:
            raise Refused(
                f"run {run_id} is archived: it ended and its rows were purged; "
                f"es-agents restore {run_id} brings it back to read"
            )
        state = loaded.state
        if state is not None:
            return state
        pending = _pending_start(run_id, verdicts)
        if pending is None:
            return None
        return fold(RunState(run_id=run_id), start(pending))

    def _gate_refusal(self, state: RunState, command: Command) -> str | None:
        if not isinstance(command, Approve | Reject) or command.gate is None:
            return None
        served = self._agent(state.agent)
        if served is None or served.gates is None or command.gate in served.gates:
            return None
        return (
            f"agent {state.agent!r} has no gate {command.gate!r} "
            f"(its gates: {', '.join(served.gates) or 'none'})"
        )

    def _await(
        self, command: Command, agent: str, position: Position, wait: float
    ) -> CommandResult:
        if wait <= 0:
            return CommandResult(command, "queued", "not awaited (--no-wait)", position)
        served = self._agent(agent)
        if served is None or not served.live(SERVED_WITHIN_SECONDS):
            return CommandResult(
                command,
                "queued",
                f"no worker serves agent {agent!r} yet; the command waits for one",
                position,
            )
        verdict = self._book.wait_verdict(command.command_id, wait)
        if verdict is not None and verdict.status in ("applied", "refused"):
            return CommandResult(command, verdict.status, verdict.reason, position)
        return CommandResult(
            command,
            "queued",
            f"no verdict within {wait:g} s; the command stays queued",
            position,
        )

    def _agent(self, name: str) -> ServedAgent | None:
        """The agent's row as workers last wrote it. A served agent is looked up
        at most once a second (workers write the row every 5 s); one not served
        (yet) every time, so the first worker is seen at once."""
        now = time.monotonic()
        cached = self._served.get(name)
        if cached is not None and now - cached[0] < AGENT_CACHE_SECONDS:
            return cached[1]
        served = self._book.agent(name)
        if served is not None and served.live(SERVED_WITHIN_SECONDS):
            self._served[name] = (now, served)
        return served

    def _check_topics(self) -> None:
        if not self._topics_checked:
            self._ports.migrate()
            self._ports.ensure_topics()
            self._topics_checked = True

    # -- reads -----------------------------------------------------------------------
    def status(self, run_id: str) -> RunView:
        """The run as applied, or ``pending`` when its start waits for a worker.
        A claim-checked payload that cannot be read back is reported, not raised."""
        unreadable: str | None = None
        # The verdicts before the log: a worker records a start as applied only
        # after its run_started is acknowledged, so a start seen as "sent" here and
        # applied a moment later is in the log the loader reads next. The other
        # order lost a run started between the two reads (neither pending nor found).
        verdicts = self._book.for_run(run_id)
        try:
            loaded = self._loader.load(run_id)
        except PayloadUnavailable as e:
            unreadable = str(e)
            loaded = self._loader.load(run_id, restore=False)
        refused = [v for v in verdicts if v.status == "refused"]
        dead = self._dead_letters(run_id)
        state = loaded.state
        if state is not None:
            state = self.reveal(run_id, state)
            return RunView(
                run_id,
                state.status,
                state.agent,
                state,
                refused,
                dead,
                {
                    "snapshot_seq": loaded.snapshot_seq,
                    "events_from_postgres": loaded.events_from_db,
                    "events_from_log": loaded.events_from_log,
                },
                unreadable,
            )
        if loaded.archived is not None:
            row = self._ports.projections.run_row(run_id) or {}
            return RunView(
                run_id,
                str(row.get("status", "archived")),
                str(row.get("agent", "")),
                None,
                refused,
                dead,
                archived=loaded.archived,
            )
        pending = _pending_start(run_id, verdicts)
        if pending is not None:
            return RunView(run_id, "pending", pending.agent, None, refused, dead)
        if refused:
            raise NotFound(
                f"unknown run {run_id}; refused: "
                + "; ".join(f"{v.type}: {v.reason}" for v in refused)
            )
        raise NotFound(f"unknown run {run_id}")

    def runs(
        self,
        status: str | None = None,
        limit: int = 100,
        *,
        agent: str | None = None,
        since: datetime | None = None,
    ) -> list[RunRow]:
        """Runs from the ``runs`` table (as of the projector), latest first: of one
        status, of one agent, updated at or after ``since`` (each when given)."""
        rows = self._ports.projections.runs(status, limit, agent=agent, since=since)
        out = []
        for row in rows:  # a thread's last message, readable with the run's key
            if row.get("last_message"):
                row["last_message"] = self.reveal(
                    str(row["run_id"]), row["last_message"]
                )
            known = {k: v for k, v in row.items() if k in _ROW_FIELDS}
            out.append(RunRow(**known))  # type: ignore[arg-type]
        return out

    def wait(
        self,
        run_id: str,
        until: Iterable[str] = FINISHED_OR_WAITING,
        timeout: float = 60.0,
    ) -> RunView:
        """The run once its status is one of ``until`` (by default: it finished or
        waits for someone). Raises ``TimeoutError`` with the last status seen."""
        waiting = Waiting(run_id, frozenset(until), timeout)
        while True:
            try:
                view: RunView | None = self.status(run_id)
            except NotFound:
                view = None  # a start not yet seen by anyone: wait for it too
            if (arrived := waiting.arrived(view)) is not None:
                return arrived
            time.sleep(waiting.pause())

    def agents(self) -> list[dict[str, object]]:
        """The agents served on this prefix: per agent its version, tools and gates
        (of the latest heartbeat), its workers live and stopped, and when the last
        heartbeat came. A worker is live when it beat within the last
        ``SERVED_WITHIN_SECONDS`` and did not say it stopped."""
        return served_agents(self._book.workers(), SERVED_WITHIN_SECONDS)

    def events(self, run_id: str) -> list[Event]:
        """The run's events as they count (claim-checked payloads read back): the
        projection's and the log's beyond the projector, in order. Raises
        ``NotFound`` for a run with none."""
        events = self.events_of([run_id])[run_id]
        if not events:
            raise NotFound(f"unknown run {run_id}")
        return events

    def events_of(self, run_ids: Iterable[str]) -> dict[str, list[Event]]:
        """``events`` of several runs at once (an empty list for a run with
        none): the log is read once per partition for them all."""
        where = {
            run_id: self._ports.projections.positions(
                run_id, self._log.partition_for(run_id)
            )
            for run_id in run_ids
        }
        out: dict[str, list[Event]] = {}
        for run_id, positions in where.items():
            if positions.archived is not None and not positions.offsets:  # purged
                events = self.retention.events(run_id)
                out[run_id] = [self.reveal(run_id, e) for e in events]
        rest = {run_id: p for run_id, p in where.items() if run_id not in out}
        topic = self.settings.kafka.events_topic
        for run_id, events in read_runs(self._log, topic, rest).items():
            out[run_id] = [self.reveal(run_id, self._log.restore(e)) for e in events]
        return out

    def dead_letters(
        self, run_id: str | None = None, limit: int = 100
    ) -> list[DeadLetter]:
        """The dead-letter topic's records (of one run), the latest ``limit``."""
        return read_dead_letters(
            self._log, self.settings.kafka.dlq_topic, run_id=run_id, limit=limit
        )

    def _dead_letters(self, run_id: str) -> list[tuple[str, int, int, str]]:
        return self._ports.projections.dead_letters(run_id)


def _budget_json(budget: Budget | Mapping[str, object] | None) -> str | None:
    """A run's own limits as its start carries them (``core.budget``)."""
    if budget is None:
        return None
    given = dataclasses.asdict(budget) if isinstance(budget, Budget) else dict(budget)
    text = json.dumps(given, sort_keys=True)
    try:
        parse_overrides(text)
    except ValueError as e:
        raise InvalidInput(str(e)) from None
    return text


_ROW_FIELDS = frozenset(f.name for f in dataclasses.fields(RunRow))


def _pending_start(run_id: str, verdicts: list[Verdict]) -> StartRun | None:
    """The run's start when it was sent and no worker has applied it yet."""
    for v in verdicts:
        if v.type == StartRun.wire_name and v.status == "sent" and v.agent:
            return StartRun(run_id=run_id, agent=v.agent, command_id=v.command_id)
    return None
