"""The projector: ``es.events`` into ``runs``, ``run_events`` and ``run_snapshots``.

A consumer group on the events topic (read_committed). Each batch is written in one
Postgres transaction together with the consumed offsets (``projector_offsets``), and
messages below the stored offset are skipped, so a projector killed at any point and
restarted ends with the same tables as one that never crashed. Rows go in with
pipelined ``executemany`` (psycopg pipelines it), not one round trip per row.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    Message,
    TopicPartition,
)

from es_agents.adapters.kafka import (
    DeadLetterQueue,
    KafkaProducerLink,
    _client,
    consume_now,
    where,
)
from es_agents.adapters.postgres import Database
from es_agents.app import build_claim_check
from es_agents.codec import AvroCodec
from es_agents.core.events import Event, Interrupted, RunCompleted, RunFailed
from es_agents.core.fold import fold
from es_agents.core.snapshot import REDUCER_VERSION, to_snapshot
from es_agents.core.state import RunState
from es_agents.crash import CrashPoints
from es_agents.errors import DecodeError, FoldError, PayloadUnavailable, Unavailable
from es_agents.resume import load_projected
from es_agents.settings import Settings

log = logging.getLogger(__name__)

SNAPSHOT_EVENTS = (Interrupted, RunCompleted, RunFailed)


@dataclass
class Batch:
    events: list[tuple[Any, ...]] = field(default_factory=list)
    snapshots: list[tuple[Any, ...]] = field(default_factory=list)
    runs: dict[str, tuple[RunState, int, int]] = field(default_factory=dict)
    offsets: dict[int, int] = field(default_factory=dict)
    dead: list[tuple[Any, ...]] = field(default_factory=list)


def load_state(
    conn: psycopg.Connection[Any],
    codec: AvroCodec,
    run_id: str,
    restore: Callable[[Event], Event] | None = None,
) -> RunState | None:
    """A run's state from the projection alone: snapshot + projected events."""
    return load_projected(conn, codec, run_id, restore)[0]


class Projector:
    def __init__(
        self,
        settings: Settings,
        *,
        batch_size: int = 2000,
        cache_size: int = 10_000,
        crash: CrashPoints | None = None,
        instance_id: str | None = None,
    ) -> None:
        self.settings = settings
        self.k = settings.snapshot_every
        self.group_id = settings.projector_group_id
        self.topic = settings.kafka.events_topic
        self.batch_size = batch_size
        self.codec = AvroCodec()
        self.crash = crash if crash is not None else CrashPoints.from_env()
        self.db = Database(settings.database_url.get_secret_value())
        self.db.migrate()
        self._link = KafkaProducerLink(settings.kafka)
        self.dlq = DeadLetterQueue(settings.kafka, self._link)
        self._cache: OrderedDict[str, RunState] = OrderedDict()
        # Runs folded without some claim-checked payload: no snapshots of them.
        self._incomplete: set[str] = set()
        claims = build_claim_check(settings)
        self.restore: Callable[[Event], Event] = (
            claims.restore if claims is not None else (lambda event: event)
        )
        self._cache_size = cache_size
        self._stop = threading.Event()
        self._at_end: set[int] = set()
        self.projected = 0
        # Milliseconds from each event's creation to the commit that projected it.
        self.lags_ms: list[float] = []
        conf = {
            **settings.kafka.consumer_config(self.group_id),
            "partition.assignment.strategy": "range",
            "enable.partition.eof": True,
            **({"group.instance.id": instance_id} if instance_id else {}),
        }
        self.consumer = Consumer(_client(conf))
        self.consumer.subscribe(
            [self.topic], on_assign=self._on_assign, on_revoke=self._on_revoke
        )

    def reset(self) -> None:
        """Empty the projections and this group's offsets: the next assignment
        projects every partition from its start. Run with no other projector up."""
        with self.db.transaction() as conn:
            conn.execute("TRUNCATE runs, run_events, run_snapshots, dead_letters")
            conn.execute(
                "DELETE FROM projector_offsets WHERE group_id = %s AND topic = %s",
                (self.group_id, self.topic),
            )
        self._cache.clear()

    # -- partitions --------------------------------------------------------------
    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Start each partition where the last committed transaction left it."""
        with self.db.transaction() as conn:
            stored = dict(
                conn.execute(
                    "SELECT partition, next_offset FROM projector_offsets "
                    "WHERE group_id = %s AND topic = %s",
                    (self.group_id, self.topic),
                ).fetchall()
            )
        for tp in partitions:
            tp.offset = stored.get(tp.partition, OFFSET_BEGINNING)
            self._at_end.discard(tp.partition)
        self._cache.clear()
        consumer.assign(partitions)
        log.info(
            "projecting partitions %s from %s",
            [p.partition for p in partitions],
            {p.partition: p.offset for p in partitions},
        )

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._cache.clear()
        consumer.unassign()

    # -- the loop ------------------------------------------------------------------
    def run(self, until_caught_up: bool = False, idle_seconds: float = 0.5) -> None:
        last_message = time.monotonic()
        try:
            while not self._stop.is_set():
                msgs = consume_now(self.consumer, self.batch_size, timeout=0.1)
                data = []
                for msg in msgs:
                    err = msg.error()
                    if err is None:
                        data.append(msg)
                        self._at_end.discard(where(msg)[1])
                    elif err.code() == KafkaError._PARTITION_EOF:
                        self._at_end.add(where(msg)[1])
                    elif err.fatal():
                        raise Unavailable(f"{self.topic}: {err}")
                if data:
                    last_message = time.monotonic()
                    self.apply(data)
                assignment = {tp.partition for tp in self.consumer.assignment()}
                if (
                    until_caught_up
                    and assignment
                    and assignment <= self._at_end
                    and time.monotonic() - last_message > idle_seconds
                ):
                    return
        finally:
            self.close()

    def stop(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self.consumer.close()
        self._link.close()
        self.db.close()

    def apply(self, msgs: list[Message]) -> None:
        """Project one batch in one transaction, offsets included; all or nothing."""
        try:
            with self.db.transaction() as conn:
                batch = self._build(conn, msgs)
                self._write(conn, batch)
                self.crash.hit("projector:before_commit")
        except BaseException:
            self._cache.clear()  # it may hold folds of what was not committed
            raise
        self.crash.hit("projector:after_commit")
        self.projected += len(batch.events)
        now = datetime.now(UTC)
        self.lags_ms.extend((now - e[5]).total_seconds() * 1000 for e in batch.events)

    def _build(self, conn: psycopg.Connection[Any], msgs: list[Message]) -> Batch:
        batch = Batch()
        by_partition: dict[int, list[Message]] = {}
        for msg in msgs:
            by_partition.setdefault(where(msg)[1], []).append(msg)
        for partition, part in by_partition.items():
            row = conn.execute(
                "SELECT next_offset FROM projector_offsets WHERE group_id = %s "
                "AND topic = %s AND partition = %s FOR UPDATE",
                (self.group_id, self.topic, partition),
            ).fetchone()
            stored = row[0] if row is not None else 0
            for msg in part:
                offset = where(msg)[2]
                if offset < stored:
                    continue  # projected by an earlier transaction
                self._project(conn, batch, msg, partition, offset)
                batch.offsets[partition] = offset + 1
        return batch

    def _project(
        self,
        conn: psycopg.Connection[Any],
        batch: Batch,
        msg: Message,
        partition: int,
        offset: int,
    ) -> None:
        payload = msg.value() or b""
        try:
            event = self.codec.decode_event(payload)
        except DecodeError as e:
            self._dead(batch, msg, f"undecodable event: {e}")
            return
        state = self._state(conn, event.run_id)
        if state is not None and event.seq <= state.seq:
            return  # a duplicate of a projected event
        event = self._restore(event)
        try:
            state = fold(
                state if state is not None else RunState(run_id=event.run_id), event
            )
        except FoldError as e:
            self._cache.pop(event.run_id, None)  # the fold may have half-changed it
            self._dead(batch, msg, f"event does not fold: {e}")
            return
        self._remember(state)
        batch.events.append(
            (
                event.run_id,
                event.seq,
                event.step,
                event.wire_name,
                event.event_id,
                event.at,
                partition,
                offset,
                payload,
            )
        )
        batch.runs[event.run_id] = (state, partition, offset)
        snapshot = (event.seq + 1) % self.k == 0 or isinstance(event, SNAPSHOT_EVENTS)
        if snapshot and event.run_id not in self._incomplete:
            batch.snapshots.append(
                (
                    event.run_id,
                    event.seq,
                    REDUCER_VERSION,
                    partition,
                    offset,
                    json.dumps(to_snapshot(state)),
                )
            )

    def _dead(self, batch: Batch, msg: Message, reason: str) -> None:
        """To es.dlq (acknowledged before the batch commits) and to ``dead_letters``
        in the batch's transaction, so the run shows it; the projector goes on."""
        topic, partition, offset = where(msg)
        log.error("%s[%d]@%d: not projected: %s", topic, partition, offset, reason)
        self.dlq.send(msg, reason)
        key = msg.key()
        run_id = key.decode(errors="replace") if isinstance(key, bytes) else key
        batch.dead.append((topic, partition, offset, run_id, reason))

    def _state(self, conn: psycopg.Connection[Any], run_id: str) -> RunState | None:
        state = self._cache.get(run_id)
        if state is not None:
            self._cache.move_to_end(run_id)
            return state
        self._incomplete.discard(run_id)
        try:
            return load_state(conn, self.codec, run_id, self.restore)
        except PayloadUnavailable as e:
            log.warning("run %s: projected without its payloads: %s", run_id, e)
            self._incomplete.add(run_id)
            return load_state(conn, self.codec, run_id)

    def _restore(self, event: Event) -> Event:
        """The event with its claim-checked payloads; without them (and no more
        snapshots of its run until it loads whole again) when they are unavailable:
        a snapshot must be the fold of the log, never of empty fields."""
        try:
            return self.restore(event)
        except PayloadUnavailable as e:
            log.warning("%s", e)
            self._incomplete.add(event.run_id)
            return event

    def _remember(self, state: RunState) -> None:
        self._cache[state.run_id] = state
        self._cache.move_to_end(state.run_id)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    def _write(self, conn: psycopg.Connection[Any], batch: Batch) -> None:
        with conn.cursor() as cur:
            if batch.events:
                cur.executemany(
                    "INSERT INTO run_events (run_id, seq, step, type, event_id, at, "
                    'partition, "offset", payload) VALUES (%s, %s, %s, %s, %s, %s, %s, '
                    "%s, %s) ON CONFLICT DO NOTHING",
                    batch.events,
                )
            if batch.snapshots:
                cur.executemany(
                    "INSERT INTO run_snapshots (run_id, seq, reducer_version, "
                    'partition, "offset", state) VALUES (%s, %s, %s, %s, %s, %s) '
                    "ON CONFLICT DO NOTHING",
                    batch.snapshots,
                )
            if batch.dead:
                cur.executemany(
                    'INSERT INTO dead_letters (topic, partition, "offset", run_id, '
                    "reason) VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                    batch.dead,
                )
            if batch.runs:
                cur.executemany(
                    _UPSERT_RUN, [_run_row(s, p, o) for s, p, o in batch.runs.values()]
                )
            cur.executemany(
                "INSERT INTO projector_offsets "
                "(group_id, topic, partition, next_offset) VALUES (%s, %s, %s, %s) "
                "ON CONFLICT (group_id, topic, partition) "
                "DO UPDATE SET next_offset = EXCLUDED.next_offset",
                [(self.group_id, self.topic, p, o) for p, o in batch.offsets.items()],
            )


_RUN_COLUMNS = (
    "run_id, agent, status, step, last_seq, waiting_reason, waiting_gate, wake_at, "
    "agent_version, code_revision, prompt_hash, model_id, tools_hash, reducer_version, "
    "prompt_tokens, completion_tokens, model_calls, tool_calls, reconciled_calls, "
    "output_json, error, partition, last_offset, started_at, updated_at"
)
_UPSERT_RUN = (
    f"INSERT INTO runs ({_RUN_COLUMNS}) VALUES ({', '.join(['%s'] * 25)}) "  # noqa: S608
    "ON CONFLICT (run_id) DO UPDATE SET "
    + ", ".join(f"{c} = EXCLUDED.{c}" for c in _RUN_COLUMNS.split(", ")[1:])
    + " WHERE runs.last_seq < EXCLUDED.last_seq"
)


def _run_row(state: RunState, partition: int, offset: int) -> tuple[Any, ...]:
    waiting = state.waiting
    v = state.versions
    return (
        state.run_id,
        state.agent,
        state.status,
        state.step,
        state.seq,
        waiting.reason if waiting else None,
        waiting.gate if waiting else None,
        waiting.wake_at if waiting else None,
        v.agent_version,
        v.code_revision,
        v.prompt_hash,
        v.model_id,
        v.tools_hash,
        v.reducer_version,
        state.prompt_tokens,
        state.completion_tokens,
        state.model_calls,
        state.tool_calls,
        state.reconciled_calls,
        state.output_json,
        state.error,
        partition,
        offset,
        state.started_at,
        state.updated_at,
    )
