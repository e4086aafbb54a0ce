"""Runs kept warm: the loaded state of the runs that last paused in this worker.

A run that pauses (an approval gate, a timer) ends its activation with its state
folded in memory. Keeping the loops of the last few such runs lets the next command
for one of them skip the load -- the projection's snapshot and events and the log's
tail, about 3 ms of round trips on the project's machine -- as long as nothing can
have been written to the run meanwhile. While this worker owns the run's partition
under one epoch, only this worker appends to it; a worker that took the partition
meanwhile took a higher epoch, and a loop kept under a lower one is dropped (as the
run loop would refuse its appends anyway). The cold load stays the path after a
restart, a rebalance, or once a run fell out of the bound.

Bounded (``ES_AGENTS_WARM_RUNS``, least recently paused out first; 0 keeps none).
Runs with encrypted payloads are never kept: their state is plaintext in memory, and
``forget`` must leave nothing to resume from.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import final

from es_agents.runtime.context import RunActor
from es_agents.runtime.run_loop import RunLoop


@final
class WarmRuns:
    def __init__(self, size: int, epoch: Callable[[int], int | None]) -> None:
        """``epoch``: a partition's current epoch in this worker (None: not owned)."""
        self.size = size
        self._epoch = epoch
        self._loops: OrderedDict[str, RunLoop] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0

    def keep(self, loop: RunLoop) -> None:
        """After a clean activation: keep the loop of a run that paused."""
        state = loop.state
        if (
            self.size <= 0
            or state is None
            or state.status != "paused"
            or loop.buffer
            or loop.ctx.encrypt
            or loop.actor.stopping
            or self._epoch(loop.actor.partition) != loop.epoch
        ):
            return
        with self._lock:
            self._loops[state.run_id] = loop
            self._loops.move_to_end(state.run_id)
            while len(self._loops) > self.size:
                self._loops.popitem(last=False)

    def take(self, actor: RunActor) -> RunLoop | None:
        """The run's kept loop, for ``actor``'s activation, if still current."""
        with self._lock:
            loop = self._loops.pop(actor.run_id, None)
        if loop is None or self._epoch(actor.partition) != loop.epoch:
            return None
        loop.actor = actor
        self.hits += 1
        return loop

    def drop(self, partitions: Iterable[int]) -> None:
        """Forget the runs of partitions this worker no longer owns."""
        gone = set(partitions)
        with self._lock:
            for run_id in [
                r for r, loop in self._loops.items() if loop.actor.partition in gone
            ]:
                del self._loops[run_id]

    def __len__(self) -> int:
        return len(self._loops)
