"""The partition driver: one append, one acknowledgement and one tail confirmation
for every run of a partition that is ready to append at once.

Runs step as coroutines on the worker's event loop. When a run must make its events
durable (an intention before its action, an outcome before the planner reads it) it
hands its sealed records to its partition's driver and waits. The driver appends
what every waiting run handed it as one batch through the partition's fenced writer,
then wakes them all; records handed in while a batch is in flight go in the next
one. So under load a partition's appends are batches of many runs' steps (one
produce request, one acknowledgement, one read-back under epoch fencing), while a
lone run's append costs what it did alone: nothing waits for a batch to fill.

Order: a run hands in its next records only after its last append returned, so each
run's events stay in order; runs of a partition interleave, as they may. A batch
fails or succeeds whole: fenced, every run in it is fenced (they share the
partition); out of reach, the worker goes down (crash-only).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import final

from es_agents.core.chain import Sealed
from es_agents.errors import FencedError
from es_agents.ports import PartitionWriter


@final
class PartitionDriver:
    """Group commit over one partition's fenced writer."""

    def __init__(self, writer: PartitionWriter, partition: int) -> None:
        self.writer = writer
        self.partition = partition
        # The writer blocks on the broker; it runs on a thread of its own so that
        # the event loop keeps stepping other runs meanwhile.
        self._thread = ThreadPoolExecutor(
            1, thread_name_prefix=f"es-append-p{partition}"
        )
        self._waiting: list[tuple[Sequence[Sealed], asyncio.Future[None]]] = []
        self._drainer: asyncio.Task[None] | None = None
        self._closed = False
        self.batches = 0  # appends made, for benchmarks
        self.records = 0

    @property
    def epoch(self) -> int:
        return self.writer.epoch

    @property
    def committed_end(self) -> int:
        return self.writer.committed_end

    async def append(self, records: Sequence[Sealed]) -> None:
        """Return once ``records`` are acknowledged and counted (with whatever
        other runs of the partition handed in meanwhile)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._waiting.append((records, done))
        if self._drainer is None:
            self._drainer = loop.create_task(self._drain())
        await done

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, []
                if self._closed:
                    _fail(batch, self._revoked())
                    continue
                records = [r for part, _ in batch for r in part]
                try:
                    await loop.run_in_executor(
                        self._thread, self.writer.append, records
                    )
                except asyncio.CancelledError:
                    _fail(batch, FencedError("the worker is stopping"))
                    raise
                except Exception as e:  # handed to every run of the batch
                    # Closed meanwhile, its thread shut: the partition was revoked.
                    _fail(batch, self._revoked() if self._closed else e)
                    continue
                self.batches += 1
                self.records += len(records)
                for _, done in batch:
                    if not done.done():
                        done.set_result(None)
        finally:
            self._drainer = None

    def _revoked(self) -> FencedError:
        return FencedError(
            f"partition {self.partition}: its writer was closed (the partition "
            "was revoked)"
        )

    def close(self) -> None:
        self._closed = True
        self.writer.close()
        self._thread.shutdown(wait=False)


def _fail(
    batch: list[tuple[Sequence[Sealed], asyncio.Future[None]]], error: Exception
) -> None:
    for _, done in batch:
        if not done.done():
            done.set_exception(error)
