"""The stream of model answers in flight (``Deltas``) on the Postgres-only store:
an unlogged table, ``stream_deltas``, kept an hour. The worker's deltas are queued
and written by a thread of their own, a few at a time (a step never waits for
them); a follower reads the run's rows after the last one it saw, every
``POLL_SECONDS``, from a point in time (so one attaching in the middle of a call
gets what was sent of it so far)."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import final

from es_agents.adapters.postgres import Database
from es_agents.errors import EsAgentsError
from es_agents.ports import Delta

log = logging.getLogger(__name__)

POLL_SECONDS = 0.02
KEPT = "1 hour"
_PRUNE_EVERY = 1000  # rows written between two prunes of the old ones


@final
class PostgresDeltas:
    def __init__(self, db: Database, prefix: str) -> None:
        self._db = db
        self._prefix = prefix
        self._queue: queue.SimpleQueue[Delta | None] = queue.SimpleQueue()
        self._writer: threading.Thread | None = None
        self._lock = threading.Lock()
        self._written = 0

    def publish(self, delta: Delta) -> None:
        if self._writer is None:
            with self._lock:
                if self._writer is None:
                    self._writer = threading.Thread(
                        target=self._write, daemon=True, name="es-deltas"
                    )
                    self._writer.start()
        self._queue.put(delta)

    def _write(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < 500:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._queue.put(None)  # after this batch
                    break
                batch.append(more)
            try:
                self._insert(batch)
            except EsAgentsError as e:  # a gap for watchers, not the run
                log.debug("%d deltas not written: %s", len(batch), e)

    def _insert(self, batch: list[Delta]) -> None:
        with self._db.transaction() as conn, conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO stream_deltas (prefix, run_id, step, attempt, kind, "
                "text, sent_at) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                [
                    (self._prefix, d.run_id, d.step, d.attempt, d.kind, d.text,
                     d.sent_at)
                    for d in batch
                ],
            )  # fmt: skip
            self._written += len(batch)
            if self._written >= _PRUNE_EVERY:
                self._written = 0
                cur.execute(
                    f"DELETE FROM stream_deltas WHERE at < now() - interval '{KEPT}'"  # noqa: S608
                )

    def follow(
        self, run_id: str, since: datetime, stop: Callable[[], bool]
    ) -> Iterator[Delta]:
        last = 0
        while True:
            with self._db.statement() as conn:
                rows = conn.execute(
                    "SELECT id, step, attempt, kind, text, sent_at FROM stream_deltas "
                    "WHERE prefix = %s AND run_id = %s AND id > %s AND at >= %s "
                    "ORDER BY id LIMIT 1000",
                    (self._prefix, run_id, last, since),
                ).fetchall()
            for row in rows:
                last = int(row[0])
                yield Delta(
                    run_id, int(row[1]), int(row[2]), row[3], row[4], float(row[5])
                )
            if not rows:
                if stop():
                    return
                time.sleep(POLL_SECONDS)

    def close(self) -> None:
        writer = self._writer
        if writer is not None:
            self._queue.put(None)
            writer.join(5)
            self._writer = None
