"""The roles the runtime needs from the outside world, as small Protocols.

The runtime (worker, run loop, effects, loader, client checks) is typed to these and
imports no adapter; ``es_agents.app`` (the composition root) builds the adapters of
the chosen store -- Kafka, Postgres, or memory for tests -- and hands them in.
Every adapter passes the contract suite of its port (``tests/contract``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Generic, Literal, Protocol, TypeVar

from es_agents.approvals import Keyring, MemoryKeyring
from es_agents.core.authorship import Authenticator
from es_agents.core.chain import Sealed
from es_agents.core.commands import Command, ForkRun, StartRun
from es_agents.core.epochs import StartFloors
from es_agents.core.events import Event
from es_agents.core.flow import Limits, Queued
from es_agents.core.rates import ModelRate
from es_agents.core.schedules import Schedule
from es_agents.core.state import RunState
from es_agents.observability import NoTelemetry, NoTracer, Telemetry, Tracer
from es_agents.vault import MemoryVault, Vault

if TYPE_CHECKING:
    from es_agents.archive import Written
    from es_agents.payloads import ClaimCheck

T = TypeVar("T")
M = TypeVar("M")


@dataclass(frozen=True, slots=True)
class Position:
    """Where a record landed: the log's acknowledgement."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class Record:
    """One record of a topic as read back: key, bytes and where it sits."""

    topic: str
    partition: int
    offset: int
    key: str | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class Received(Generic[M]):
    """A decoded message and where it was read."""

    message: M
    topic: str
    partition: int
    offset: int
    key: str | None = None
    headers: tuple[tuple[str, bytes], ...] = ()


class EventLog(Protocol):
    """The append-only log: runs' events, commands, dead letters (topics of records
    keyed by run id; a run's records share one partition number)."""

    # Signs what is appended and verifies what is read (None: neither).
    auth: Authenticator | None

    @property
    def restore(self) -> Callable[[Event], Event]:
        """Reads claim-checked payloads back into an event (identity without)."""
        ...

    def encode(self, message: Event | Command) -> bytes: ...

    def decode_event(self, data: bytes) -> Event: ...

    def decode_command(self, data: bytes) -> Command: ...

    def append(self, events: Sequence[Event]) -> list[Position]:
        """Seal plain events (the hash chain, after the heads this log wrote) and
        append them: for tools and tests that write whole runs."""
        ...

    def seal(self, events: Sequence[Event], head: bytes) -> list[Sealed]:
        """One run's events chained after ``head`` (the digest of its last event)
        and signed with the writer key: ready for ``append_sealed``."""
        ...

    def append_sealed(self, records: Sequence[Sealed]) -> list[Position]:
        """Return only after every record is durable, in order; raise otherwise."""
        ...

    def send(self, command: Command) -> Position:
        """Append a command to the commands topic; durable when it returns."""
        ...

    def send_all(self, commands: Sequence[Command]) -> list[Position]:
        """Several commands, durable when it returns (produced together)."""
        ...

    def produce(
        self,
        topic: str,
        key: str,
        value: bytes,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> Position:
        """Append raw bytes (dead letters); durable when it returns."""
        ...

    def partition_for(self, run_id: str) -> int: ...

    def partition_count(self) -> int:
        """Partitions of the events topic (the commands topic has as many)."""
        ...

    def read_run(
        self,
        run_id: str,
        from_offset: int = 0,
        at_least: int = 0,
        restore: bool = True,
    ) -> list[Event]:
        """The run's events in order, from a partition offset to the current end
        (and at least to ``at_least``: an offset this process knows committed)."""
        ...

    def read_sealed(
        self,
        run_id: str,
        from_offset: int = 0,
        at_least: int = 0,
        restore: bool = True,
        until_seq: int | None = None,
        *,
        floors: Mapping[str, int] | None = None,
    ) -> list[Sealed]:
        """``read_run`` with each event's bytes as written (to check the chain);
        ``until_seq``: stop once the run's event at that seq is read; ``floors``:
        the epoch floors of the events partition at ``from_offset`` (see
        ``read_partition``)."""
        ...

    def read_partition(
        self,
        topic: str,
        partition: int,
        start: int = 0,
        at_least: int = 0,
        *,
        floors: StartFloors | None = None,
    ) -> Iterator[Record]:
        """Records of one partition from ``start`` to its current end. On the
        events topic of a log fenced by epochs only the events that count
        (``es_agents.core.epochs``): claims and zombie writes are left out, starting
        from ``floors``, the partition's epoch floors at ``start`` (or the
        ``EpochFence`` a previous read that ended at ``start`` left: carried on)."""
        ...

    def end_offset(self, topic: str, partition: int) -> int: ...

    def close(self) -> None: ...


class PartitionWriter(Protocol):
    """The fenced way to append one partition's events: once another worker owns
    the partition, ``append`` raises ``FencedError`` and nothing of it is read."""

    @property
    def committed_end(self) -> int:
        """The offset after this writer's last append (read your writes)."""
        ...

    @property
    def epoch(self) -> int:
        """The owner's epoch: its fencing token."""
        ...

    def append(self, records: Sequence[Sealed]) -> None: ...

    def close(self) -> None: ...


class Subscription(Protocol[T]):
    """A consumer-group member on one topic: the partitions it owns, decoded
    messages from them, and offsets committed only when the caller says so.
    Undecodable messages are dead-lettered and reported by ``drain_skipped``."""

    def poll(
        self, timeout: float = 1.0, max_messages: int = 500
    ) -> list[Received[T]]: ...

    def drain_skipped(self) -> list[tuple[int, int]]: ...

    def caught_up(self) -> bool:
        """Every owned partition was read to its end."""
        ...

    def commit_offsets(self, offsets: Mapping[int, int]) -> bool:
        """False when the group moved on (a rebalance); raise when unreachable."""
        ...

    def close(self) -> None: ...


# Called with the partitions gained; may return start offsets to read them from.
OnAssign = Callable[[list[int]], Mapping[int, int] | None]
OnRevoke = Callable[[list[int]], None]
# Called instead of ``OnRevoke`` for partitions lost rather than handed over (the
# member's session expired or it was fenced, as when the group coordinator's broker
# died): they usually come back to the same member once it has joined again.
OnLost = Callable[[list[int]], None]


class Subscribe(Protocol):
    """Join ``group`` on ``topic``: the store's consumer-group membership.
    ``gather_ms``: a read may wait up to this long for records to gather (fewer,
    larger reads for a reader that can trail the log a little; the Kafka store's
    fetches, the others read what is there). Without ``on_lost``, lost partitions
    go to ``on_revoke``."""

    def __call__(
        self,
        topic: str,
        group: str,
        decode: Callable[[bytes], T],
        *,
        on_assign: OnAssign | None = None,
        on_revoke: OnRevoke | None = None,
        on_lost: OnLost | None = None,
        instance_id: str | None = None,
        gather_ms: int = 0,
    ) -> Subscription[T]: ...


EffectStatus = Literal["new", "started", "done"]


@dataclass(frozen=True)
class EffectRecord:
    status: EffectStatus
    result_json: str | None = None
    error: str | None = None


class EffectLedger(Protocol):
    """The dedupe table: at most one call per idempotency key."""

    def begin(self, key: str, run_id: str, step: int, tool: str) -> EffectRecord:
        """Claim ``key`` before calling; ``new`` means: call now, then ``finish``."""
        ...

    def finish(self, key: str, result_json: str | None, error: str | None) -> None: ...

    def release(self, key: str) -> None:
        """Drop a claim whose call provably did not happen."""
        ...

    def get(self, key: str) -> EffectRecord | None: ...

    def entries(self, run_prefix: str = "") -> list[tuple[str, str, EffectStatus]]:
        """(key, run id, status) of every claim, for audits."""
        ...


Due = tuple[str, str, datetime]  # a due timer: (timer_id, run_id, due_at)


class Timers(Protocol):
    """Durable timers, due by the store's clock."""

    def schedule(self, timer_id: str, run_id: str, due_at: datetime) -> None: ...

    def fire_due(self, fire: Callable[[Sequence[Due]], None], limit: int = 1000) -> int:
        """``fire`` up to ``limit`` due timers, (timer_id, run_id, due_at) each, in
        one call that makes their wake-ups durable; then mark them fired."""
        ...

    def get(self, timer_id: str) -> tuple[datetime, datetime | None] | None: ...


@dataclass(frozen=True)
class ScheduleRow:
    """A schedule as kept: the definition, its first unfired tick, the MAC of the
    worker that set it (``core.schedules.signed_bytes``), and what it started."""

    schedule: Schedule
    next_due: datetime
    mac: str | None
    last_tick: datetime | None = None
    last_run_id: str | None = None
    updated_at: datetime | None = None


Moved = tuple[datetime, datetime | None]  # a schedule's next_due, last tick fired


class Schedules(Protocol):
    """Schedules of a topic prefix, due by the store's clock."""

    def put(self, row: ScheduleRow) -> None:
        """Create or replace the schedule ``row.schedule.name``."""
        ...

    def delete(self, name: str) -> bool: ...

    def get(self, name: str) -> ScheduleRow | None: ...

    def list(self, agent: str | None = None) -> list[ScheduleRow]: ...

    def fire_due(
        self,
        agent: str,
        fire: Callable[[Sequence[ScheduleRow], datetime], Mapping[str, Moved]],
        limit: int = 100,
    ) -> int:
        """Call ``fire`` with up to ``limit`` unpaused schedules of ``agent`` that
        are due, and the store's time; ``fire`` makes their starts durable and
        returns, by name, each one's new ``next_due`` and the last tick it fired
        (None: none), stored in the same transaction (a crash in between fires the
        same ticks again: the same run ids). The number of schedules taken."""
        ...


class Flow(Protocol):
    """The places of an agent's active runs and the queue of runs waiting for one
    (``core.flow``), shared by every worker of a topic prefix."""

    def take(
        self, agent: str, run_id: str, tenant: str | None, priority: int, limits: Limits
    ) -> bool:
        """Whether ``run_id`` holds a place: it held one, or one is free and no
        queued run comes before it (``core.flow.ahead``) -- then it holds it now."""
        ...

    def enqueue(
        self, agent: str, run_id: str, tenant: str | None, priority: int, since_seq: int
    ) -> None:
        """Queue ``run_id`` behind the runs queued before it; a run queued already
        keeps its place (and takes the new ``since_seq``)."""
        ...

    def release(self, run_id: str) -> None:
        """``run_id`` takes no more steps for now (it waits, or it ended): its place
        is free and it leaves the queue."""
        ...

    def admit(
        self,
        agent: str,
        limits: Limits,
        wake: Callable[[Sequence[Queued]], None],
        limit: int = 100,
    ) -> list[Queued]:
        """Give the free places to queued runs (``core.flow.admit``): ``wake`` makes
        their wake-ups durable, in the transaction that gives the places (when it
        raises, nothing was given). The runs woken."""
        ...

    def counts(self, agent: str) -> tuple[int, int]:
        """The agent's active runs (places held) and queued runs."""
        ...


@dataclass(frozen=True)
class ArchiveRow:
    """Where a finished run's archive is, and whether its rows were purged."""

    run_id: str
    key: str
    sha256: str
    events: int
    last_seq: int
    archived_at: datetime
    purged_at: datetime | None


class Archives(Protocol):
    """Finished runs' archives and purges (``es_agents.retention``): the rows that
    say where a run's archive is, the run's projected events to archive, and the
    purge of its projection rows with its claims on payload objects."""

    def finished(self, run_id: str) -> tuple[str, int] | None:
        """The run's status and last seq by the projection (None: unknown)."""
        ...

    def archived(self, run_id: str) -> ArchiveRow | None: ...

    def record(
        self, run_id: str, key: str, sha256: str, events: int, last_seq: int
    ) -> None:
        """The run's archive is stored under ``key`` (its rows not purged yet)."""
        ...

    def purge(self, run_id: str) -> list[str]:
        """Delete the finished, archived run's projection rows (not its ``runs``
        row) and its claims on payload objects, in one transaction; ``Refused``
        when it is not finished, not archived, or has events its archive lacks.
        Returns the payload keys no run claims any more."""
        ...

    def unclaim(self, run_id: str) -> list[str]:
        """Remove the run's claims on payload objects; the keys no run claims
        (kept as orphans until ``settle``d)."""
        ...

    def orphaned(self, limit: int = 1000) -> list[str]:
        """Payload objects no run claims, not deleted yet (oldest first)."""
        ...

    def settle(self, keys: list[str]) -> None:
        """These orphans are deleted (or gone): forget them."""
        ...

    def restore(self, run_id: str, rows: list[Written], keys: list[str]) -> None:
        """Put a purged run's events (and its claims on ``keys``) back."""
        ...

    def due(self, agent: str, ended_before: datetime, limit: int) -> list[str]:
        """The agent's runs that ended before ``ended_before``, not purged."""
        ...

    def purged(self, run_prefix: str = "") -> set[str]:
        """The runs (ids starting with ``run_prefix``) whose rows were purged."""
        ...


class ModelRates(Protocol):
    """The models' rate limits, counted for every worker of a topic prefix
    (``core.rates``), by the store's clock."""

    def take(self, model_id: str, rate: ModelRate) -> float:
        """One request of ``model_id``: 0.0 when it may go now (it is counted),
        else the seconds to wait before asking again (nothing was counted)."""
        ...

    def spend(self, model_id: str, tokens: int) -> None:
        """Count the tokens an answer used in the current window."""
        ...

    def cool_down(self, model_id: str, seconds: float) -> None:
        """No request of ``model_id`` for ``seconds`` (a 429's ``Retry-After``),
        from any worker."""
        ...


VerdictStatus = Literal["sent", "applied", "refused"]


@dataclass(frozen=True)
class Verdict:
    command_id: str
    run_id: str
    type: str
    status: VerdictStatus
    reason: str | None
    agent: str | None = None
    sent_at: datetime | None = None
    decided_at: datetime | None = None


@dataclass(frozen=True)
class ServedAgent:
    agent: str
    agent_version: str
    gates: list[str] | None  # None: the agent does not declare its gates
    tools: list[str]
    group_id: str
    seen_at: datetime
    age_seconds: float
    stopped: bool  # every worker of the agent said it stopped
    encrypted: bool = False  # its payloads are encrypted under each run's data key

    def live(self, within_seconds: float) -> bool:
        return not self.stopped and self.age_seconds <= within_seconds


@dataclass(frozen=True)
class ServingWorker:
    """One worker process serving one agent, as of its last heartbeat."""

    agent: str
    worker_id: str
    agent_version: str
    tools: list[str]
    gates: list[str] | None
    seen_at: datetime
    age_seconds: float
    stopped: bool


@dataclass(frozen=True)
class Decided:
    """One verdict a worker reached: ``reason`` is None when applied."""

    command: Command
    status: Literal["applied", "refused"]
    reason: str | None = None


class CommandBook(Protocol):
    """What became of each command, and which agents are served."""

    def decided(self, verdicts: Sequence[Decided]) -> None: ...

    def serve(  # noqa: PLR0917 - one row's columns
        self,
        worker_id: str,
        agent: str,
        agent_version: str,
        gates: Sequence[str] | None,
        tools: Sequence[str],
        group_id: str,
        encrypted: bool = False,
    ) -> None: ...

    def retire(self, worker_id: str, agent: str) -> None: ...

    def reserve_start(
        self, command: StartRun | ForkRun, run_exists: bool
    ) -> str | None:
        """Record a start as sent; the reason when its run id is taken."""
        ...

    def sent(self, command: Command) -> None: ...

    def verdict(self, command_id: str) -> Verdict | None: ...

    def wait_verdict(self, command_id: str, timeout: float) -> Verdict | None:
        """The command's verdict once decided (applied or refused), as soon as it
        is written; None when none came within ``timeout`` seconds."""
        ...

    def for_run(self, run_id: str) -> list[Verdict]: ...

    def agent(self, name: str) -> ServedAgent | None: ...

    def workers(self) -> list[ServingWorker]:
        """Every worker that serves or served an agent on this prefix (stopped ones
        for a day), by agent then latest heartbeat first."""
        ...


@dataclass(frozen=True)
class Positions:
    """Where a run's projected events are in the log (``run_events``), read
    together with the projector's offset and epoch floors on its partition."""

    offsets: Mapping[int, int]  # log offset -> seq, of each projected event
    projected_until: int = 0
    floors: Mapping[str, int] = field(default_factory=dict)
    archived: str | None = None  # the run's archive, when its rows were purged


@dataclass(frozen=True)
class Projected:
    """A run as far as the projection has it: the latest snapshot of this reducer
    version plus the projected events after it, and the projector's offset for the
    run's partition, all read together."""

    state: RunState | None
    snapshot_seq: int | None
    events: int
    projected_until: int
    head: bytes = b""  # digest of the last projected event's bytes (the chain's head)
    # The partition's epoch floors at ``projected_until`` (per writer group).
    floors: Mapping[str, int] = field(default_factory=dict)
    # The run's archive, when its rows were purged (``es_agents.retention``).
    archived: str | None = None


class Projections(Protocol):
    """The read side the runtime resumes from (O(K)): snapshots, projected events,
    the projector's offsets, the ``runs`` table."""

    def projected_until(self, partition: int) -> int:
        """The projector's next offset on the events partition (0: nothing)."""
        ...

    def load(
        self, run_id: str, partition: int, restore: Callable[[Event], Event] | None
    ) -> Projected: ...

    def running(self, partition: int, agent: str) -> set[str]:
        """Runs of ``agent`` on the partition the projection says are running."""
        ...

    def next_epoch(self, group: str, partition: int) -> int:
        """Take the partition's next epoch: the fencing token of its new owner."""
        ...

    def current_epoch(self, group: str, partition: int) -> int | None:
        """The partition's epoch taken last (None: none yet). A writer whose epoch
        it still is, read after its append was acknowledged, knows no higher claim
        precedes that append."""
        ...

    def dead_letters(self, run_id: str) -> list[tuple[str, int, int, str]]: ...

    def positions(self, run_id: str, partition: int) -> Positions:
        """Where the run's projected events are in the log, and how far the
        projector got on its partition (``es_agents.history`` reads them)."""
        ...

    def runs(
        self,
        status: str | None,
        limit: int,
        agent: str | None = None,
        since: datetime | None = None,
    ) -> list[dict[str, object]]:
        """Rows of the ``runs`` table, latest first: of one status, of one agent,
        updated at or after ``since`` (each filter when given)."""
        ...

    def run_row(self, run_id: str) -> dict[str, object] | None:
        """The run's ``runs`` row (the columns of ``core.run_row``), if projected."""
        ...

    def latest_snapshot(self, run_id: str) -> tuple[int, object] | None:
        """(seq, state as stored) of the run's latest snapshot, if any."""
        ...

    def run_rows(self, run_prefix: str = "") -> dict[str, dict[str, object]]:
        """Every ``runs`` row (run id -> columns of ``core.run_row``), for audits."""
        ...

    def first_offset(self, run_id: str) -> int | None:
        """The log offset of the run's first event, if projected (forks read the
        origin's log from there rather than from the partition's start)."""
        ...

    def event_digests(self, run_prefix: str = "") -> dict[str, dict[int, bytes | None]]:
        """SHA-256 of each projected event's bytes, where the projection keeps
        them (run id -> seq -> digest, None for an event whose bytes are the log's
        alone), for audits: a row changed, deleted or added shows against the
        log."""
        ...

    def snapshot_states(self, run_prefix: str = "") -> dict[str, tuple[int, object]]:
        """Each run's latest snapshot (seq, state as stored, without its transcript
        inline), for audits."""
        ...


class Probe(Protocol):
    """Crash points and the acknowledgement journal (tests, chaos); no-op by default."""

    def hit(self, point: str) -> None: ...

    def acked(self, events: Sequence[Event]) -> None: ...

    def close(self) -> None: ...


class NoProbe:
    def hit(self, point: str) -> None:
        pass

    def acked(self, events: Sequence[Event]) -> None:
        pass

    def close(self) -> None:
        pass


DeltaKind = Literal["start", "text", "end"]


@dataclass(frozen=True, slots=True)
class Delta:
    """A piece of a model's answer while the call is in flight, for people and
    applications watching the run; not an event (the durable answer is the
    ``model_responded`` event). A call's deltas come between its ``start`` and its
    ``end``; a call re-issued after a crash starts again with a higher ``attempt``
    (what came before it is void). ``text`` of an ``end``: "" when the call
    answered, else why it did not."""

    run_id: str
    step: int  # the model call's step
    attempt: int
    kind: DeltaKind
    text: str = ""
    sent_at: float = 0.0  # the worker's clock (seconds since the epoch)


class Deltas(Protocol):
    """The stream of deltas, beside the log: published by the worker without
    waiting (a delta lost is a gap in what is shown, never in the run), followed
    by clients from a point in time."""

    def publish(self, delta: Delta) -> None: ...

    def follow(
        self, run_id: str, since: datetime, stop: Callable[[], bool]
    ) -> Iterator[Delta]:
        """The run's deltas sent at or after ``since`` (as far as kept), then new
        ones as they come, until ``stop()`` is true (checked at least every 100 ms
        when nothing comes)."""
        ...

    def close(self) -> None: ...


# Builds the fenced writer of (group, partition); it takes the partition's next epoch
# by calling the third argument (a writer may need to look at the log first).
WriterFactory = Callable[[str, int, Callable[[], int]], PartitionWriter]


@dataclass
class Ports:
    """One store's adapters, built by the composition root (``es_agents.app``)."""

    store: str  # kafka | postgres | memory
    log: EventLog
    subscribe: Subscribe
    writer: WriterFactory
    projections: Projections
    ledger: EffectLedger
    timers: Timers
    book: CommandBook
    ensure_topics: Callable[[], dict[str, int]]  # partitions per topic
    migrate: Callable[[], object] = lambda: None
    claims: ClaimCheck | None = None
    probe: Probe = field(default_factory=NoProbe)
    telemetry: Telemetry = field(default_factory=NoTelemetry)  # observability.py
    tracer: Tracer = field(default_factory=NoTracer)
    keyring: Keyring = field(default_factory=MemoryKeyring)  # approvers' keys
    vault: Vault = field(default_factory=MemoryVault)  # runs' data keys
    closers: list[Callable[[], None]] = field(default_factory=list)
    # Model answers streamed while the call is in flight (None: this store has none).
    deltas: Deltas | None = None
    # Runs started on a cron expression or an interval (None: this store has none).
    schedules: Schedules | None = None
    # Places of active runs and the queue for them (None: this store has none).
    flow: Flow | None = None
    # The models' shared rate limits (None: this store keeps none).
    rates: ModelRates | None = None
    # Finished runs' archives and purges (None: this store keeps none).
    archives: Archives | None = None
    # The writer keys (``core.authorship``), read after the migrations ran.
    writer_keys: Callable[[], Authenticator | None] = lambda: None

    def close(self) -> None:
        self.log.close()
        self.probe.close()
        if self.deltas is not None:
            self.deltas.close()
        for close in self.closers:
            close()
