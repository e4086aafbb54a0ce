"""Fencing by epochs in the log (the default): claim the partition, stamp every
append with the epoch, and confirm each append by reading the partition past it.

On assignment the writer notes the partition's end, takes the next epoch, appends a
claim and reads to it: a claim of a higher epoch before its own means another worker
took the partition after it did (it never acts). Every append then carries the epoch
in a header and goes out through the process's idempotent producer, so appends of
all runs and partitions share librdkafka's batches. An append returns once the broker
acknowledged it *and* it is known that no higher claim precedes it: an acknowledged
append is one that every reader counts (``es_agents.core.epochs``). Two ways tell:

- the partition's tail reader read past it without meeting a higher claim (the usual
  way: the broker answers the parked fetch as the records land, alongside the
  acknowledgement -- no transaction, no extra round trip);
- or, when the tail is slow to get there (its fetch session still on a broker that
  died, a leader that moved), the epoch store still names this writer's epoch *after*
  the acknowledgement: a claim is appended only after its epoch was taken there, so
  no higher claim can lie below an offset acknowledged before that read. The tail
  catches up on its own and still fences every later append.

A worker paused past its session timeout wakes, appends, and finds the heir's claim
before its records (and the heir's epoch in the store): ``FencedError`` on the first
append.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, final

from confluent_kafka import Consumer, TopicPartition

from es_agents.adapters.kafka import KafkaEventLog, where
from es_agents.adapters.kafka_producer import _client
from es_agents.core.authorship import Authenticator
from es_agents.core.chain import Sealed
from es_agents.core.epochs import CLAIM_HEADER, claim_headers, claimed, epoch_headers
from es_agents.errors import AppendError, FencedError
from es_agents.ports import Position
from es_agents.settings import KafkaSettings

log = logging.getLogger(__name__)

_CONFIRM_TIMEOUT = 30.0
# A read-back with no progress for this long refreshes metadata and fetches again
# (a partition whose leader died is fetched from its new leader at once).
_KICK_AFTER = 3.0
_RENEW_AFTER_KICKS = 2  # kicks without progress before the tail's consumer is new
# An append acknowledged this long ago and not yet read back is confirmed by the epoch
# store instead (when the writer has one): a leader change costs the cluster's own
# failover, not the tail consumer's.
_ASK_AFTER = 0.25

# An append waiting to be counted: offset, whom to tell, deadline, and since when
# (its acknowledgement).
_Waiter = tuple[int, Callable[[Exception | None], None], float, float]


@final
class PartitionTail:
    """Reads one events partition from a given offset, for one thing: how far it has
    read, and the first claim of ``group`` with an epoch above ``epoch`` (where the
    writer was fenced). With ``epoch_now`` (the partition's epoch in the epoch
    store), appends it is slow to read back are confirmed by the store."""

    def __init__(
        self,
        settings: KafkaSettings,
        group: str,
        partition: int,
        start: int,
        epoch: int,
        *,
        auth: Authenticator | None = None,
        epoch_now: Callable[[], int | None] | None = None,
    ) -> None:
        self.topic = settings.events_topic
        self._epoch_now = epoch_now
        self.auth = auth
        self.group = group
        self.partition = partition
        self.epoch = epoch
        conf = settings.consumer_config(f"{settings.topic_prefix}.tail")
        # Not a group member: assigned by hand, never commits. Claims are plain
        # records and the writer's own appends are acknowledged ones, so the tail
        # reads up to the high watermark; a fetch parks at the end for at most
        # 100 ms and returns as soon as records land.
        conf.update(
            {
                "isolation.level": "read_uncommitted",
                "fetch.wait.max.ms": 100,
                "enable.partition.eof": False,
            }
        )
        self._conf = _client(conf)
        self._consumer = Consumer(self._conf)
        self._consumer.assign([TopicPartition(self.topic, partition, start)])
        self._cond = threading.Condition()
        self.position = start  # every offset below it has been read
        self.fenced_at: int | None = None  # offset of the first higher claim
        self.fenced_by: int | None = None
        self._error: str | None = None
        self._closed = False
        self._kick = False  # a reader waits and nothing comes: fetch afresh
        self._kicks = 0  # kicks in a row without progress
        # Appends waiting to be read past, told by callback (``when_past``).
        # (offset, done, deadline, since): since is when the append was acknowledged.
        self._waiters: list[_Waiter] = []
        self._moved_at = time.monotonic()  # when the position last advanced
        self.counted = -1  # every offset up to it is confirmed by the epoch store
        self._asking = False  # an epoch-store check is under way
        self._thread = threading.Thread(
            target=self._run, daemon=True, name=f"es-tail-p{partition}"
        )
        self._thread.start()

    def _refetch(self) -> None:
        """Nothing read for a while though a reader waits (e.g. the partition's
        leader changed): new metadata, and fetch again from where we are; after
        ``_RENEW_AFTER_KICKS`` such kicks without progress, a new consumer (new
        connections: the old one may be stuck on a broker that is gone)."""
        self._kick = False
        self._kicks += 1
        here = TopicPartition(self.topic, self.partition, self.position)
        if self._kicks % _RENEW_AFTER_KICKS == 0:
            log.info("%s[%d]: tail stalled: new consumer", self.topic, self.partition)
            self._consumer.close()
            self._consumer = Consumer(self._conf)
            self._consumer.assign([here])
            return
        self._consumer.list_topics(self.topic, timeout=5)
        self._consumer.seek(here)

    def _run(self) -> None:
        while not self._closed:
            try:
                if self._kick:
                    self._refetch()
                consumer = self._consumer
                msgs = consumer.consume(num_messages=1, timeout=0.1)
                if msgs:
                    msgs += consumer.consume(num_messages=1000, timeout=0)
            except Exception as e:
                with self._cond:
                    self._error = str(e)
                    self._cond.notify_all()
                self._answer_waiters()
                return
            if not msgs:
                self._check_waiters()
                continue
            position = self.position
            fenced_at, fenced_by = self.fenced_at, self.fenced_by
            for msg in msgs:
                if msg.error() is not None:
                    log.debug("%s[%d]: %s", self.topic, self.partition, msg.error())
                    continue
                offset = where(msg)[2]
                if msg.key() is None and fenced_at is None:
                    headers = _headers(msg)
                    group, epoch = claimed(headers) or ("", 0)
                    if (
                        group == self.group
                        and epoch > self.epoch
                        and self._authored(headers)
                    ):
                        fenced_at, fenced_by = offset, epoch
                position = max(position, offset + 1)
            if position > self.position:
                self._kicks = 0
                self._moved_at = time.monotonic()
            with self._cond:
                self.position = position
                self.fenced_at, self.fenced_by = fenced_at, fenced_by
                self._cond.notify_all()
            self._answer_waiters()

    def _authored(self, headers: list[tuple[str, bytes]]) -> bool:
        """A claim counts only with a worker's MAC (when authenticating): nobody
        else can fence this writer out of its partition."""
        if self.auth is None:
            return True
        stamp = next((v for k, v in headers if k == CLAIM_HEADER), b"")
        if self.auth.verifies_claim(headers, stamp):
            return True
        log.warning(
            "%s[%d]: a claim without a worker's MAC left out",
            self.topic,
            self.partition,
        )
        return False

    def when_past(
        self,
        offset: int,
        done: Callable[[Exception | None], None],
        timeout: float = _CONFIRM_TIMEOUT,
    ) -> None:
        """``read_past`` without blocking: ``done(None)`` once every record up to
        ``offset`` was read (or the epoch store confirmed it) and none of them is a
        higher claim, else ``done(FencedError | AppendError)`` -- at once on this
        thread when it is known now, later on the tail's thread."""
        with self._cond:
            verdict = self._verdict(offset)
            if verdict is _PENDING:
                now = time.monotonic()
                self._waiters.append((offset, done, now + timeout, now))
                return
        done(verdict)  # type: ignore[arg-type]

    def _verdict(self, offset: int) -> Exception | object | None:
        """What ``read_past(offset)`` would end with now, or ``_PENDING``."""
        if self.fenced_at is not None and self.fenced_at <= offset:
            return self._fenced()
        if self.position > offset or offset <= self.counted:
            return None
        if self.fenced_at is not None:
            return None
        if self._error is not None:
            return AppendError(
                f"{self.topic}[{self.partition}]: tail read failed: {self._error}"
            )
        if self._closed:
            return self._revoked(offset)
        return _PENDING

    def _fenced(self) -> FencedError:
        return FencedError(
            f"{self.topic}[{self.partition}]: fenced: epoch {self.fenced_by} "
            f"claimed the partition at offset {self.fenced_at} "
            f"(this writer holds epoch {self.epoch})"
        )

    def _revoked(self, offset: int) -> FencedError:
        return FencedError(
            f"{self.topic}[{self.partition}]: the writer was closed "
            f"(the partition was revoked) before offset {offset} was read back"
        )

    def _answer_waiters(self) -> None:
        """Tell the waiters whose verdict is known (outside the lock)."""
        if not self._waiters:
            return
        answered: list[tuple[Callable[[Exception | None], None], object]] = []
        with self._cond:
            still = []
            for waiter in self._waiters:
                verdict = self._verdict(waiter[0])
                if verdict is _PENDING:
                    still.append(waiter)
                else:
                    answered.append((waiter[1], verdict))
            self._waiters = still
        for done, verdict in answered:
            done(verdict)  # type: ignore[arg-type]

    def _check_waiters(self) -> None:
        """Nothing read: kick a stalled fetch, ask the epoch store about appends
        waiting since ``_ASK_AFTER``, and fail appends past their deadline. A
        tail behind what the store confirmed is kicked too: it must read on to see
        a later claim."""
        behind = self.counted >= self.position
        if not self._waiters and not behind:
            return
        now = time.monotonic()
        if now - self._moved_at > _KICK_AFTER:
            self._kick = True
            self._moved_at = now
        if not self._waiters:
            return
        with self._cond:
            late = [w for w in self._waiters if w[2] <= now]
            self._waiters = [w for w in self._waiters if w[2] > now]
            slow = [w for w in self._waiters if w[0] > self.counted]
            asked = max((w[0] for w in slow), default=-1)
            ask = (
                self._epoch_now is not None
                and not self._asking
                and self.fenced_at is None
                and any(now - w[3] > _ASK_AFTER for w in slow)
            )
            if ask:
                self._asking = True
        if ask and self._epoch_now is not None:
            threading.Thread(
                target=self._ask,
                args=(self._epoch_now, asked),
                daemon=True,
                name="es-tail-epoch",
            ).start()
        for offset, done, deadline, since in late:
            done(
                AppendError(
                    f"{self.topic}[{self.partition}]: offset {offset} not read "
                    f"back within {deadline - since:.0f}s (read up to "
                    f"{self.position})"
                )
            )

    def _ask(self, epoch_now: Callable[[], int | None], offset: int) -> None:
        """Confirm every append up to ``offset`` (all acknowledged before this
        call) by the epoch store: still this writer's epoch means no higher claim
        was appended yet, so none lies below them."""
        try:
            epoch = epoch_now()
        except Exception as e:  # the store is out of reach: the tail decides
            log.debug("%s[%d]: epoch check failed: %s", self.topic, self.partition, e)
            epoch = None
        with self._cond:
            self._asking = False
            if epoch == self.epoch and offset > self.counted:
                self.counted = offset
                self._cond.notify_all()
        if epoch is not None and epoch != self.epoch:
            log.info(
                "%s[%d]: epoch %d taken since this writer's %d: the tail decides",
                self.topic,
                self.partition,
                epoch,
                self.epoch,
            )
        self._answer_waiters()

    def read_past(self, offset: int, timeout: float = _CONFIRM_TIMEOUT) -> None:
        """Return once every record up to ``offset`` was read (or confirmed by the
        epoch store) and none of them is a higher claim; raise ``FencedError`` if
        one is, ``AppendError`` when neither is known within ``timeout``."""
        answered = threading.Event()
        outcome: list[Exception | None] = []

        def done(error: Exception | None) -> None:
            outcome.append(error)
            answered.set()

        self.when_past(offset, done, timeout)
        answered.wait(timeout + 5)
        if not outcome:
            raise AppendError(
                f"{self.topic}[{self.partition}]: offset {offset} not read "
                f"back within {timeout:.0f}s (read up to {self.position})"
            )
        if outcome[0] is not None:
            raise outcome[0]

    def close(self) -> None:
        """Appends still waiting are fenced at once; then the tail's thread is
        waited for (5 s at most) and its consumer closed."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()  # an append waiting on its read-back is fenced
        self._answer_waiters()
        self._thread.join(5)
        self._answer_waiters()
        self._consumer.close()


_PENDING = object()


def _headers(msg: Any) -> list[tuple[str, bytes]]:
    return [(k, v or b"") for k, v in (msg.headers() or [])]


@final
class EpochWriter:
    """The fenced writer of one events partition, by epochs in the log."""

    def __init__(
        self,
        log_: KafkaEventLog,
        group: str,
        partition: int,
        take_epoch: Callable[[], int],
        epoch_now: Callable[[], int | None] | None = None,
    ) -> None:
        settings = log_.settings
        self.topic = settings.events_topic
        self.group = group
        self.partition = partition
        self._log = log_
        self._link = link = log_.link
        # Where the tail starts: the end *before* the epoch is taken. A claim of a
        # later epoch is appended after that epoch was taken, so after this offset.
        start = log_.end_offset(self.topic, partition)
        self.epoch = take_epoch()
        self._headers: list[tuple[str, str | bytes | None]] = list(
            epoch_headers(group, self.epoch)
        )
        auth = log_.auth
        self._tail = PartitionTail(
            settings,
            group,
            partition,
            start,
            self.epoch,
            auth=auth,
            epoch_now=epoch_now,
        )
        claim_record = claim_headers(group, self.epoch)
        if auth is not None:
            claim_record.append(auth.claim_header(claim_record[0][1]))
        self._closed = False
        self.committed_end = 0
        try:
            claim = link.wait(
                [
                    link.produce(
                        self.topic,
                        None,
                        b"",
                        list[tuple[str, str | bytes | None]](claim_record),
                        partition=partition,
                    )
                ]
            )[0]
            self._confirm(claim.offset)  # read to our own claim before acting
        except BaseException:
            self._tail.close()
            raise
        log.info(
            "%s[%d]: claimed at offset %d with epoch %d",
            self.topic,
            partition,
            claim.offset,
            self.epoch,
        )

    def append(self, records: Sequence[Sealed]) -> None:
        """Return once the records are acknowledged and counted; raise
        ``FencedError`` once another worker claimed the partition before them."""
        if self._closed:
            raise FencedError(
                f"{self.topic}[{self.partition}]: this writer was closed: the "
                "partition was revoked"
            )
        tail = self._tail
        if tail.fenced_at is not None:
            tail.read_past(tail.fenced_at)  # raises FencedError
        positions = self._link.append_all(
            self.topic, self.partition, self._stamped(records)
        )
        self._confirm(max(p.offset for p in positions))

    def submit(
        self, records: Sequence[Sealed], done: Callable[[Exception | None], None]
    ) -> None:
        """``append`` without blocking the caller: ``done(None)`` once the records
        are acknowledged and counted, ``done(error)`` otherwise (on the producer's
        or the tail's thread, or at once)."""
        if self._closed:
            done(self._tail._revoked(-1))
            return
        tail = self._tail
        if tail.fenced_at is not None:
            tail.when_past(tail.fenced_at, done)  # a FencedError
            return

        def acked(positions: list[Position], error: Exception | None) -> None:
            if error is not None:
                done(error)
                return
            offset = max(p.offset for p in positions)
            if offset < 0:  # acknowledged without a position: find it off-thread
                threading.Thread(target=self._confirm_later, args=(done,)).start()
                return

            def counted(error: Exception | None) -> None:
                if error is None:
                    self.committed_end = max(self.committed_end, offset + 1)
                done(error)

            tail.when_past(offset, counted)

        self._link.submit_all(self.topic, self.partition, self._stamped(records), acked)

    def _confirm_later(self, done: Callable[[Exception | None], None]) -> None:
        try:
            self._confirm(-1)
        except (AppendError, FencedError) as e:
            done(e)
        else:
            done(None)

    def _confirm(self, offset: int) -> None:
        if offset < 0:
            # Acknowledged without a position (a batch retried across a broker
            # restart): it is durable, so it lies below the end as of now.
            offset = self._end() - 1
        self._tail.read_past(offset)
        self.committed_end = max(self.committed_end, offset + 1)

    def _stamped(
        self, records: Sequence[Sealed]
    ) -> list[tuple[str | None, bytes, list[tuple[str, str | bytes | None]]]]:
        """Key, value and headers of each record, the epoch's header first."""
        return [
            (
                r.event.run_id,
                r.value,
                [*self._headers, *r.headers] if r.headers else self._headers,
            )
            for r in records
        ]

    def _end(self) -> int:
        return self._log.end_offset(self.topic, self.partition)

    def close(self) -> None:
        self._closed = True
        self._tail.close()
