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
import contextlib
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
        self._busy = False
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
        other runs of the partition handed in meanwhile).

        A run that finds no append in flight makes it itself (a lone run pays no
        hand-off); runs that come while one is in flight wait, and the next batch
        -- all of theirs -- is appended by a task once it returned."""
        loop = asyncio.get_running_loop()
        if self._busy:
            done: asyncio.Future[None] = loop.create_future()
            self._waiting.append((records, done))
            await done
            return
        self._busy = True
        try:
            if self._closed:
                raise self._revoked()
            try:
                await self._append(loop, list(records))
            except Exception as e:
                if self._closed:  # revoked during the append, its thread shut
                    raise self._revoked() from e
                raise
            self._count(len(records))
        finally:
            if self._waiting:
                self._drainer = loop.create_task(self._drain())
            else:
                self._busy = False

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
                    await self._append(loop, records)
                except asyncio.CancelledError:
                    _fail(batch, FencedError("the worker is stopping"))
                    raise
                except Exception as e:  # handed to every run of the batch
                    # Closed meanwhile, its thread shut: the partition was revoked.
                    _fail(batch, self._revoked() if self._closed else e)
                    continue
                self._count(len(records))
                for _, done in batch:
                    if not done.done():
                        done.set_result(None)
        finally:
            self._drainer = None
            self._busy = False

    def _count(self, records: int) -> None:
        self.batches += 1
        self.records += records

    async def _append(
        self, loop: asyncio.AbstractEventLoop, records: list[Sealed]
    ) -> None:
        """One append through the writer: by callback when it offers ``submit``
        (no thread of ours waits), else its blocking ``append`` on our thread."""
        submit = getattr(self.writer, "submit", None)
        if submit is None:
            await loop.run_in_executor(self._thread, self.writer.append, records)
            return
        answer: asyncio.Future[None] = loop.create_future()

        def done(error: Exception | None) -> None:  # on the writer's thread
            with contextlib.suppress(RuntimeError):  # the loop closed: going down
                loop.call_soon_threadsafe(_settle, answer, error)

        submit(records, done)
        await answer

    def _revoked(self) -> FencedError:
        return FencedError(
            f"partition {self.partition}: its writer was closed (the partition "
            "was revoked)"
        )

    def close(self) -> None:
        self._closed = True
        self.writer.close()
        self._thread.shutdown(wait=False)


def _settle(answer: asyncio.Future[None], error: Exception | None) -> None:
    if answer.done():
        return
    if error is None:
        answer.set_result(None)
    else:
        answer.set_exception(error)


def _fail(
    batch: list[tuple[Sequence[Sealed], asyncio.Future[None]]], error: Exception
) -> None:
    for _, done in batch:
        if not done.done():
            done.set_exception(error)
