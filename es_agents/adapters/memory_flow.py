"""Flow control's places and queue in memory (``ports.Flow``), for tests of the
runtime in one process: one lock stands for Postgres's advisory lock."""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from typing import final

from es_agents.core.flow import Limits, Queued, admit, ahead, may_take


@final
class MemoryFlow:
    def __init__(self) -> None:
        self._places: dict[str, tuple[str, str | None]] = {}  # run: agent, tenant
        self._queue: dict[str, tuple[str, Queued]] = {}  # run: agent, its place
        self._seq = itertools.count(1)
        self._lock = threading.Lock()

    def _held(self, agent: str) -> Counter[str | None]:
        return Counter(t for a, t in self._places.values() if a == agent)

    def _queued(self, agent: str) -> list[Queued]:
        return [q for a, q in self._queue.values() if a == agent]

    def take(
        self, agent: str, run_id: str, tenant: str | None, priority: int, limits: Limits
    ) -> bool:
        with self._lock:
            if run_id in self._places:
                return True
            held = self._held(agent)
            if not may_take(limits, sum(held.values()), held[tenant], tenant):
                return False
            if ahead(self._queued(agent), run_id, priority):
                return False
            self._places[run_id] = (agent, tenant)
            self._queue.pop(run_id, None)
            return True

    def enqueue(
        self, agent: str, run_id: str, tenant: str | None, priority: int, since_seq: int
    ) -> None:
        with self._lock:
            if run_id in self._places:  # given one since it asked: nothing to wait for
                return
            kept = self._queue.get(run_id)
            seq = kept[1].seq if kept is not None else next(self._seq)
            self._queue[run_id] = (
                agent,
                Queued(run_id, tenant, priority, seq, since_seq),
            )

    def release(self, run_id: str) -> None:
        with self._lock:
            self._places.pop(run_id, None)
            self._queue.pop(run_id, None)

    def admit(
        self,
        agent: str,
        limits: Limits,
        wake: Callable[[Sequence[Queued]], None],
        limit: int = 100,
    ) -> list[Queued]:
        with self._lock:
            chosen = admit(self._queued(agent), self._held(agent), limits)[:limit]
            if chosen:
                wake(chosen)  # raises: nothing given
                for q in chosen:
                    self._places[q.run_id] = (agent, q.tenant)
                    self._queue.pop(q.run_id, None)
            return chosen

    def counts(self, agent: str) -> tuple[int, int]:
        with self._lock:
            return sum(self._held(agent).values()), len(self._queued(agent))
