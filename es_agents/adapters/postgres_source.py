"""A consumer-group member on a Postgres topic (the ``Subscription`` port).

Membership: each member writes its row every second and holds a session-level
advisory lock on its own connection. A member is alive while it was seen within the
session timeout *and* its lock is held -- a killed process loses its lock with its
connection at once; a paused one stops being seen. Partitions are spread over the
live members in order (partition ``p`` to member ``p mod n``); a member takes a
partition only when its lease is free, expired, or held by a member that is not
alive, and gives up those no longer its own (after ``on_revoke``). Fencing of what a
paused member might still write is the writer's epoch check, not the lease.

Records are read by offset from each owned partition; with nothing new, the member
waits for ``es_log`` notifications (``LISTEN``) up to the poll timeout, so a command
is seen at once and an idle member costs one query per poll.
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar, final

import psycopg

from es_agents.adapters.postgres import Database
from es_agents.adapters.postgres_log import CHANNEL, record
from es_agents.dead_letters import DeadLetterQueue
from es_agents.errors import ConfigError, DecodeError, Unavailable
from es_agents.ports import OnAssign, OnLost, OnRevoke, Received

log = logging.getLogger(__name__)

T = TypeVar("T")
HEARTBEAT_SECONDS = 1.0


@final
class PostgresSource(Generic[T]):
    def __init__(
        self,
        db: Database,
        topic: str,
        group_id: str,
        decode: Callable[[bytes], T],
        dlq: DeadLetterQueue,
        *,
        session_timeout: float = 10.0,
        on_assign: OnAssign | None = None,
        on_revoke: OnRevoke | None = None,
        on_lost: OnLost | None = None,  # a lease lost is another member's: revoked
        instance_id: str | None = None,
        gather_ms: int = 0,  # reads return what is there
    ) -> None:
        self.topic = topic
        self._db = db
        self._group = group_id
        self._decode = decode
        self._dlq = dlq
        self._timeout = session_timeout
        self._on_assign = on_assign
        self._on_revoke = on_revoke
        self._member = instance_id or uuid.uuid4().hex
        self._positions: dict[int, int] = {}
        self._at_end: set[int] = set()
        self._skipped: list[tuple[int, int]] = []
        self._last_beat = 0.0
        try:
            self._listen = psycopg.connect(db.url, autocommit=True)
            self._lock_key = int(
                self._listen.execute(
                    "SELECT hashtextextended(%s, 0)",
                    (f"{group_id}/{topic}/{self._member}",),
                ).fetchone()[0]  # type: ignore[index]
            )
            taken = self._listen.execute(
                "SELECT pg_try_advisory_lock(%s)", (self._lock_key,)
            ).fetchone()
            if taken is None or not taken[0]:
                self._listen.close()
                raise ConfigError(
                    f"member {self._member!r} of {group_id} is already running "
                    "(another process with the same --instance-id)"
                )
            self._listen.execute(f"LISTEN {CHANNEL}")
        except psycopg.OperationalError as e:
            raise Unavailable(f"postgres: {e}") from e

    # -- membership -----------------------------------------------------------------
    def _beat(self) -> None:
        """Say we are alive, then give up and take partitions to match the group."""
        with self._db.transaction() as conn:
            conn.execute(
                "INSERT INTO log_members (group_id, topic, member_id, lock_key, "
                "seen_at) VALUES (%s, %s, %s, %s, now()) ON CONFLICT "
                "(group_id, topic, member_id) DO UPDATE SET seen_at = now()",
                (self._group, self.topic, self._member, self._lock_key),
            )
            live = self._live(conn)
            count = conn.execute(
                "SELECT count(*) FROM log_heads WHERE topic = %s", (self.topic,)
            ).fetchone()
        n = int(count[0]) if count is not None else 0
        mine = {p for p in range(n) if live[p % len(live)] == self._member}
        held = set(self._positions)
        lost = held - self._renew(held)
        give_up = (held - lost) - mine
        if lost or give_up:
            self._revoke(sorted(lost | give_up), release=give_up)
        self._take(sorted(mine - set(self._positions)), live)

    def _live(self, conn: psycopg.Connection[Any]) -> list[str]:
        rows = conn.execute(
            "SELECT member_id, lock_key, seen_at > now() - make_interval(secs => %s) "
            "FROM log_members WHERE group_id = %s AND topic = %s ORDER BY member_id",
            (self._timeout, self._group, self.topic),
        ).fetchall()
        live = []
        for member, key, recent in rows:
            if member == self._member or (recent and not self._lock_free(int(key))):
                live.append(member)
        return live

    def _lock_free(self, key: int) -> bool:
        """Whether nobody holds a member's lock (its process is gone)."""
        row = self._listen.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
        if row is not None and row[0]:
            self._listen.execute("SELECT pg_advisory_unlock(%s)", (key,))
            return True
        return False

    def _renew(self, held: set[int]) -> set[int]:
        if not held:
            return set()
        with self._db.transaction() as conn:
            rows = conn.execute(
                "UPDATE log_owners SET lease_until = now() + make_interval(secs => %s) "
                "WHERE group_id = %s AND topic = %s AND member_id = %s "
                "AND partition = ANY(%s) RETURNING partition",
                (self._timeout, self._group, self.topic, self._member, list(held)),
            ).fetchall()
        return {int(r[0]) for r in rows}

    def _take(self, wanted: list[int], live: list[str]) -> None:
        if not wanted:
            return
        with self._db.transaction() as conn:
            rows = conn.execute(
                "INSERT INTO log_owners (group_id, topic, partition, member_id, "
                "lease_until) SELECT %s, %s, p, %s, now() + make_interval(secs => %s) "
                "FROM unnest(%s::int[]) AS p ON CONFLICT (group_id, topic, partition) "
                "DO UPDATE SET member_id = EXCLUDED.member_id, "
                "lease_until = EXCLUDED.lease_until WHERE log_owners.member_id IS NULL "
                "OR log_owners.lease_until < now() OR log_owners.member_id = "
                "EXCLUDED.member_id OR log_owners.member_id <> ALL(%s) "
                "RETURNING partition",
                (self._group, self.topic, self._member, self._timeout, wanted, live),
            ).fetchall()
            gained = sorted(int(r[0]) for r in rows)
            committed = dict(
                conn.execute(
                    "SELECT partition, next_offset FROM log_offsets "
                    "WHERE group_id = %s "
                    "AND topic = %s AND partition = ANY(%s)",
                    (self._group, self.topic, gained),
                ).fetchall()
            )
        if not gained:
            return
        starts = self._on_assign(gained) if self._on_assign is not None else None
        for p in gained:
            start = starts.get(p) if starts is not None else None
            self._positions[p] = int(
                start if start is not None else committed.get(p, 0)
            )
            self._at_end.discard(p)
        log.info("%s: %s owns partitions %s", self._group, self._member[:8], gained)

    def _revoke(self, partitions: list[int], release: set[int]) -> None:
        if self._on_revoke is not None:
            self._on_revoke(partitions)
        for p in partitions:
            self._positions.pop(p, None)
            self._at_end.discard(p)
        if release:
            with self._db.transaction() as conn:
                conn.execute(
                    "UPDATE log_owners SET member_id = NULL, lease_until = now() "
                    "WHERE group_id = %s AND topic = %s AND member_id = %s "
                    "AND partition = ANY(%s)",
                    (self._group, self.topic, self._member, sorted(release)),
                )

    # -- reading --------------------------------------------------------------------
    def poll(self, timeout: float = 1.0, max_messages: int = 500) -> list[Received[T]]:
        try:
            return self._poll(timeout, max_messages)
        except psycopg.OperationalError as e:  # the server went away: crash-only
            raise Unavailable(f"postgres: {e}") from e

    def _poll(self, timeout: float, max_messages: int) -> list[Received[T]]:
        now = time.monotonic()
        if now - self._last_beat > HEARTBEAT_SECONDS:
            self._beat()
            self._last_beat = now
        out = self._fetch(max_messages)
        if not out and timeout > 0:
            self._wait(timeout)
            out = self._fetch(max_messages)
        return out

    def _fetch(self, limit: int) -> list[Received[T]]:
        if not self._positions:
            return []
        parts = sorted(self._positions)
        with self._db.transaction() as conn:
            rows = conn.execute(
                'SELECT r.partition, r."offset", r.key, r.value, r.headers '
                "FROM unnest(%s::int[], %s::bigint[]) AS p(partition, pos) "
                "CROSS JOIN LATERAL (SELECT * FROM log_records l WHERE l.topic = %s "
                'AND l.partition = p.partition AND l."offset" >= p.pos '
                'ORDER BY l."offset" LIMIT %s) r ORDER BY r.partition, r."offset"',
                (parts, [self._positions[p] for p in parts], self.topic, limit),
            ).fetchall()
        counts: dict[int, int] = {}
        out: list[Received[T]] = []
        for partition, offset, key, value, headers in rows:
            counts[partition] = counts.get(partition, 0) + 1
            if partition not in self._positions:
                continue
            self._positions[partition] = int(offset) + 1
            try:
                message = self._decode(bytes(value))
            except DecodeError as e:
                rec = record(self.topic, partition, offset, key, value, headers)
                self._dlq.send(rec, str(e))
                self._skipped.append((partition, int(offset)))
                continue
            pairs = record(self.topic, partition, offset, key, b"", headers).headers
            out.append(
                Received(message, self.topic, partition, int(offset), key, pairs)
            )
        for p in parts:
            if counts.get(p, 0) < limit:
                self._at_end.add(p)
            else:
                self._at_end.discard(p)
        return out

    def _wait(self, timeout: float) -> None:
        for _ in self._listen.notifies(timeout=timeout, stop_after=1):
            pass

    def caught_up(self) -> bool:
        return bool(self._positions) and set(self._positions) <= self._at_end

    def drain_skipped(self) -> list[tuple[int, int]]:
        skipped, self._skipped = self._skipped, []
        return skipped

    def commit_offsets(self, offsets: Mapping[int, int]) -> bool:
        """Commit while this member still owns each partition; False otherwise."""
        parts = sorted(offsets)
        with self._db.transaction() as conn:
            owned = conn.execute(
                "SELECT partition FROM log_owners WHERE group_id = %s AND topic = %s "
                "AND member_id = %s AND partition = ANY(%s) FOR SHARE",
                (self._group, self.topic, self._member, parts),
            ).fetchall()
            if len(owned) != len(parts):
                return False
            conn.execute(  # one statement: see _append on pipelines
                "INSERT INTO log_offsets (group_id, topic, partition, next_offset) "
                "SELECT %s, %s, p, o FROM unnest(%s::int[], %s::bigint[]) AS t(p, o) "
                "ON CONFLICT (group_id, topic, partition) "
                "DO UPDATE SET next_offset = EXCLUDED.next_offset",
                (self._group, self.topic, parts, [offsets[p] for p in parts]),
            )
        return True

    def close(self) -> None:
        """Leave the group: revoke, release every lease, drop the member row."""
        try:
            held = sorted(self._positions)
            if held:
                self._revoke(held, release=set(held))
            with self._db.transaction() as conn:
                conn.execute(
                    "DELETE FROM log_members WHERE group_id = %s AND topic = %s "
                    "AND member_id = %s",
                    (self._group, self.topic, self._member),
                )
        finally:
            # Release the member's lock before the connection goes: the server ends
            # a closed session a moment later, and a new member of the same
            # instance id started meanwhile would find the lock still held.
            with contextlib.suppress(psycopg.Error):
                self._listen.execute("SELECT pg_advisory_unlock(%s)", (self._lock_key,))
            self._listen.close()
