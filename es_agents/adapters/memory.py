"""In-memory adapters of the read-write ports (ledger, timers, command book,
projections, blobs), for tests of the runtime in one process."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import final

from es_agents.core.commands import Command, ForkRun, StartRun
from es_agents.core.events import Event
from es_agents.core.schedules import run_id_for
from es_agents.errors import ConfigError, PayloadUnavailable
from es_agents.ports import (
    Decided,
    Delta,
    Due,
    EffectRecord,
    EffectStatus,
    Moved,
    Positions,
    Projected,
    ScheduleRow,
    ServedAgent,
    ServingWorker,
    Verdict,
)


@final
class InMemoryBlobStore:
    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.written: dict[str, datetime] = {}
        self._lock = threading.Lock()

    def put(self, key: str, data: bytes) -> None:
        with self._lock:
            self.objects[key] = data
            self.written[key] = datetime.now(UTC)

    def written_at(self, key: str) -> datetime | None:
        with self._lock:
            return self.written.get(key)

    def get(self, key: str) -> bytes:
        with self._lock:
            data = self.objects.get(key)
        if data is None:
            raise PayloadUnavailable(f"{key}: no such object")
        return data

    def delete(self, key: str) -> None:
        with self._lock:
            self.objects.pop(key, None)
            self.written.pop(key, None)


@final
class MemoryEffectLedger:
    def __init__(self) -> None:
        self._rows: dict[str, EffectRecord] = {}
        self._lock = threading.Lock()

    def begin(self, key: str, run_id: str, step: int, tool: str) -> EffectRecord:
        with self._lock:
            found = self._rows.get(key)
            if found is None:
                self._rows[key] = EffectRecord("started")
                return EffectRecord("new")
            return found

    def finish(self, key: str, result_json: str | None, error: str | None) -> None:
        with self._lock:
            found = self._rows.get(key)
            if found is None or found.status != "started":
                raise ConfigError(f"effect {key} was not started, or already finished")
            self._rows[key] = EffectRecord("done", result_json, error)

    def release(self, key: str) -> None:
        with self._lock:
            found = self._rows.get(key)
            if found is not None and found.status == "started":
                del self._rows[key]

    def get(self, key: str) -> EffectRecord | None:
        with self._lock:
            return self._rows.get(key)

    def entries(self, run_prefix: str = "") -> list[tuple[str, str, EffectStatus]]:
        with self._lock:
            return [
                (key, key.rsplit(":", 1)[0], record.status)
                for key, record in self._rows.items()
                if key.startswith(run_prefix)
            ]


@final
class MemoryTimers:
    """Timers due by ``clock`` (the wall clock; tests may give a virtual one)."""

    def __init__(self, clock: Callable[[], datetime] | None = None) -> None:
        self._rows: dict[str, tuple[str, datetime, datetime | None]] = {}
        self._lock = threading.Lock()
        self.clock: Callable[[], datetime] = clock or (lambda: datetime.now(UTC))

    def schedule(self, timer_id: str, run_id: str, due_at: datetime) -> None:
        with self._lock:
            self._rows[timer_id] = (run_id, due_at, None)

    def fire_due(self, fire: Callable[[Sequence[Due]], None], limit: int = 1000) -> int:
        now = self.clock()
        with self._lock:
            due = sorted(
                (due_at, timer_id, run_id)
                for timer_id, (run_id, due_at, fired) in self._rows.items()
                if fired is None and due_at <= now
            )[:limit]
        if due:
            fire([(timer_id, run_id, due_at) for due_at, timer_id, run_id in due])
        with self._lock:
            for due_at, timer_id, run_id in due:
                self._rows[timer_id] = (run_id, due_at, now)
        return len(due)

    def get(self, timer_id: str) -> tuple[datetime, datetime | None] | None:
        with self._lock:
            row = self._rows.get(timer_id)
        return None if row is None else (row[1], row[2])


@final
class MemorySchedules:
    """Schedules due by ``clock``; one lock stands for Postgres's row locks."""

    def __init__(self, clock: Callable[[], datetime] | None = None) -> None:
        self._rows: dict[str, ScheduleRow] = {}
        self._lock = threading.RLock()
        self.clock: Callable[[], datetime] = clock or (lambda: datetime.now(UTC))

    def put(self, row: ScheduleRow) -> None:
        with self._lock:
            self._rows[row.schedule.name] = row

    def delete(self, name: str) -> bool:
        with self._lock:
            return self._rows.pop(name, None) is not None

    def get(self, name: str) -> ScheduleRow | None:
        with self._lock:
            return self._rows.get(name)

    def list(self, agent: str | None = None) -> list[ScheduleRow]:
        with self._lock:
            rows = sorted(self._rows.values(), key=lambda r: r.schedule.name)
        return [r for r in rows if agent is None or r.schedule.agent == agent]

    def fire_due(
        self,
        agent: str,
        fire: Callable[[Sequence[ScheduleRow], datetime], Mapping[str, Moved]],
        limit: int = 100,
    ) -> int:
        now = self.clock()
        with self._lock:  # held while firing, as the rows' locks are
            due = sorted(
                (
                    r
                    for r in self._rows.values()
                    if r.schedule.agent == agent
                    and not r.schedule.paused
                    and r.next_due <= now
                ),
                key=lambda r: r.next_due,
            )[:limit]
            if not due:
                return 0
            for name, (next_due, tick) in fire(due, now).items():
                row = self._rows.get(name)
                if row is None:
                    continue
                self._rows[name] = replace(
                    row,
                    next_due=next_due,
                    last_tick=tick or row.last_tick,
                    last_run_id=run_id_for(name, tick) if tick else row.last_run_id,
                )
        return len(due)


@final
class MemoryCommandBook:
    def __init__(self) -> None:
        self._verdicts: dict[str, Verdict] = {}
        self._agents: dict[str, tuple[ServedAgent, float]] = {}
        self._workers: dict[tuple[str, str], tuple[ServedAgent, float]] = {}
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)

    def decided(self, verdicts: Sequence[Decided]) -> None:
        now = datetime.now(UTC)
        with self._lock:
            for v in verdicts:
                old = self._verdicts.get(v.command.command_id)
                if old is not None and old.status == "applied":
                    continue
                self._verdicts[v.command.command_id] = Verdict(
                    v.command.command_id,
                    v.command.run_id,
                    v.command.wire_name,
                    v.status,
                    v.reason,
                    v.command.agent
                    if isinstance(v.command, StartRun | ForkRun)
                    else None,
                    old.sent_at if old is not None else None,
                    now,
                )
            self._changed.notify_all()

    def serve(  # noqa: PLR0917 - one row's columns
        self,
        worker_id: str,
        agent: str,
        agent_version: str,
        gates: Sequence[str] | None,
        tools: Sequence[str],
        group_id: str,
        encrypted: bool = False,
    ) -> None:
        served = ServedAgent(
            agent,
            agent_version,
            None if gates is None else list(gates),
            list(tools),
            group_id,
            datetime.now(UTC),
            0.0,
            False,
            encrypted,
        )
        with self._lock:
            self._agents[agent] = (served, time.monotonic())
            self._workers[agent, worker_id] = (served, time.monotonic())

    def retire(self, worker_id: str, agent: str) -> None:
        with self._lock:
            found = self._agents.get(agent)
            if found is not None:
                self._agents[agent] = (replace(found[0], stopped=True), found[1])
            mine = self._workers.get((agent, worker_id))
            if mine is not None:
                self._workers[agent, worker_id] = (
                    replace(mine[0], stopped=True),
                    mine[1],
                )

    def reserve_start(
        self, command: StartRun | ForkRun, run_exists: bool
    ) -> str | None:
        with self._lock:
            for v in self._verdicts.values():
                if (
                    v.run_id == command.run_id
                    and v.type in (StartRun.wire_name, ForkRun.wire_name)
                    and v.status != "refused"
                ):
                    if v.command_id == command.command_id:
                        return None
                    if v.status == "sent":
                        return f"run {command.run_id} is already pending"
                    return f"run {command.run_id} already exists"
            if run_exists:
                return f"run {command.run_id} already exists"
        self.sent(command)
        return None

    def sent(self, command: Command) -> None:
        with self._lock:
            self._verdicts.setdefault(
                command.command_id,
                Verdict(
                    command.command_id,
                    command.run_id,
                    command.wire_name,
                    "sent",
                    None,
                    command.agent if isinstance(command, StartRun | ForkRun) else None,
                    datetime.now(UTC),
                ),
            )

    def verdict(self, command_id: str) -> Verdict | None:
        with self._lock:
            return self._verdicts.get(command_id)

    def wait_verdict(self, command_id: str, timeout: float) -> Verdict | None:
        def decided() -> Verdict | None:
            found = self._verdicts.get(command_id)
            return found if found is not None and found.status != "sent" else None

        with self._changed:
            return self._changed.wait_for(decided, timeout)

    def for_run(self, run_id: str) -> list[Verdict]:
        with self._lock:
            return [v for v in self._verdicts.values() if v.run_id == run_id]

    def workers(self) -> list[ServingWorker]:
        now = time.monotonic()
        with self._lock:
            rows = sorted(self._workers.items(), key=lambda kv: (kv[0][0], -kv[1][1]))
        return [
            ServingWorker(
                agent,
                worker_id,
                served.agent_version,
                served.tools,
                served.gates,
                served.seen_at,
                now - at,
                served.stopped,
            )
            for (agent, worker_id), (served, at) in rows
        ]

    def agent(self, name: str) -> ServedAgent | None:
        with self._lock:
            found = self._agents.get(name)
        if found is None:
            return None
        return replace(found[0], age_seconds=time.monotonic() - found[1])


@final
class MemoryProjections:
    """No projection: every resume folds the run's log (still correct, not O(K))."""

    def __init__(
        self,
        next_epoch: Callable[[str, int], int],
        current_epoch: Callable[[str, int], int | None] = lambda g, p: None,
    ) -> None:
        self._next_epoch = next_epoch
        self._current_epoch = current_epoch

    def projected_until(self, partition: int) -> int:
        return 0

    def load(
        self, run_id: str, partition: int, restore: Callable[[Event], Event] | None
    ) -> Projected:
        return Projected(None, None, 0, 0)

    def running(self, partition: int, agent: str) -> set[str]:
        return set()

    def next_epoch(self, group: str, partition: int) -> int:
        return self._next_epoch(group, partition)

    def current_epoch(self, group: str, partition: int) -> int | None:
        return self._current_epoch(group, partition)

    def dead_letters(self, run_id: str) -> list[tuple[str, int, int, str]]:
        return []

    def positions(self, run_id: str, partition: int) -> Positions:
        return Positions({})

    def runs(
        self,
        status: str | None,
        limit: int,
        agent: str | None = None,
        since: datetime | None = None,
    ) -> list[dict[str, object]]:
        return []

    def run_row(self, run_id: str) -> dict[str, object] | None:
        return None

    def latest_snapshot(self, run_id: str) -> tuple[int, object] | None:
        return None

    def run_rows(self, run_prefix: str = "") -> dict[str, dict[str, object]]:
        return {}

    def first_offset(self, run_id: str) -> int | None:
        return None

    def event_digests(self, run_prefix: str = "") -> dict[str, dict[int, bytes | None]]:
        return {}

    def snapshot_states(self, run_prefix: str = "") -> dict[str, tuple[int, object]]:
        return {}


@final
class MemoryDeltas:
    """The stream of deltas in this process (tests, the in-memory harness)."""

    def __init__(self) -> None:
        self._deltas: list[Delta] = []
        self._cond = threading.Condition()

    def publish(self, delta: Delta) -> None:
        with self._cond:
            self._deltas.append(delta)
            self._cond.notify_all()

    def follow(
        self, run_id: str, since: datetime, stop: Callable[[], bool]
    ) -> Iterator[Delta]:
        seen = 0
        floor = since.timestamp()
        while True:
            with self._cond:
                if seen >= len(self._deltas) and not stop():
                    self._cond.wait(0.1)
                new, seen = self._deltas[seen:], len(self._deltas)
            for delta in new:
                if delta.run_id == run_id and delta.sent_at >= floor:
                    yield delta
            if not new and stop():
                return

    def close(self) -> None:
        pass
