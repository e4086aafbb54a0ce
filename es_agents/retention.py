"""What happens to a run after it ends: archived, purged, restored when asked.

A finished run's events live in the log and, projected, in Postgres (``run_events``,
its tail, snapshots, transcript chunks). Kept for ever, the projection grows with
every run ever made. An agent's ``Retention`` says how long a finished run stays
projected:

1. **archive**: the run's events, as written, go to the object store as one Avro
   object container file (``es_agents.archive``), with the payload objects its
   events claim; the file is read back and checked (sequence, hash chain, payloads)
   before anything is deleted, and recorded in ``run_archives``;
2. **purge**: its projection rows go, in one transaction that checks the run is
   finished and has no event its archive lacks; its ``runs`` row stays, so a
   command for it is refused as archived (never mistaken for an unknown run whose
   id a new start could take), and ``status`` and ``runs`` still list it. Payload
   objects no other run claims (a fork's copied events claim its origin's; equal
   payloads share one object) are deleted, unless written within the grace period
   (``ES_AGENTS_PAYLOAD_DELETE_GRACE_HOURS``, 24): a run still going may have just
   stored the same bytes before its claim reached the projection;
3. **restore** puts the archived events and payloads back; ``show`` and ``replay``
   read a purged run from its archive.

Workers apply their agents' policies (``Retention(purge_after=...)``, or
``ES_AGENTS_PURGE_AFTER_DAYS``) every minute; ``es-agents archive RUN`` and
``es-agents restore RUN`` do it by hand. ``forget`` deletes the run's payload
objects and archive too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from es_agents import archive as ocf
from es_agents.archive import Written
from es_agents.core.events import Event
from es_agents.core.retention import Retention
from es_agents.core.step import Refused
from es_agents.errors import ConfigError, EsAgentsError, NotFound
from es_agents.history import read_projected
from es_agents.payloads import ClaimCheck

if TYPE_CHECKING:
    from es_agents.codec import AvroCodec
    from es_agents.payloads import BlobStore
    from es_agents.ports import Archives, Ports
    from es_agents.settings import Settings

log = logging.getLogger(__name__)


class ArchiveBroken(EsAgentsError):
    """An archive that does not hold what its run wrote: nothing is deleted."""


@dataclass(frozen=True)
class Archived:
    run_id: str
    key: str
    events: int
    payloads: int
    purged: bool
    deleted: int  # payload objects deleted (no other run claims them)


class Retainer:
    """Archive, purge and restore over a store's ports."""

    def __init__(self, ports: Ports, settings: Settings) -> None:
        self._ports = ports
        self._prefix = settings.kafka.topic_prefix
        self._events_topic = settings.kafka.events_topic
        self._grace = timedelta(hours=settings.payload_delete_grace_hours)

    @property
    def _archives(self) -> Archives:
        if self._ports.archives is None:
            raise ConfigError(f"the {self._ports.store} store keeps no archives")
        return self._ports.archives

    @property
    def _blobs(self) -> BlobStore:
        if self._ports.claims is None:
            raise ConfigError(
                "archives go to the object store: set ES_AGENTS_PAYLOADS=s3 and "
                "the ES_AGENTS_S3_* settings"
            )
        return self._ports.claims.store

    @property
    def _codec(self) -> AvroCodec:
        codec: AvroCodec = self._ports.log.codec  # type: ignore[attr-defined]
        return codec

    def archive(self, run_id: str, purge: bool = True) -> Archived:
        """Archive a finished run and, with ``purge``, delete its projection rows
        and unclaimed payloads (a run purged already: its archive as it is)."""
        archives, blobs = self._archives, self._blobs
        row = archives.archived(run_id)
        if row is not None and row.purged_at is not None:
            return Archived(run_id, row.key, row.events, 0, True, 0)
        finished = archives.finished(run_id)
        if finished is None:
            raise NotFound(f"unknown run {run_id}")
        status, last_seq = finished
        if status not in ("completed", "failed", "cancelled"):
            raise Refused(f"run {run_id} is {status}: only a finished run is archived")
        written = self._written(run_id)
        if not written or written[-1].seq != last_seq:
            raise Refused(
                f"run {run_id}: the projection holds {len(written)} of its "
                f"{last_seq + 1} events: let the projector catch up first"
            )
        data = ocf.write(run_id, self._prefix, written, self._codec, blobs.get)
        made = ocf.read(data)
        problems = ocf.check(made, self._codec.decode_event, last_seq)
        if problems:
            raise ArchiveBroken(f"run {run_id}: not archived: {'; '.join(problems)}")
        key, digest = ocf.key_of(self._prefix, run_id), ocf.sha256(data)
        blobs.put(key, data)
        if ocf.sha256(blobs.get(key)) != digest:
            raise ArchiveBroken(f"run {run_id}: {key} does not read back as written")
        archives.record(run_id, key, digest, len(written), last_seq)
        deleted = self._delete(archives.purge(run_id)) if purge else 0
        log.info("run %s archived to %s (%d events)", run_id, key, len(written))
        return Archived(run_id, key, len(written), len(made.payloads()), purge, deleted)

    def _written(self, run_id: str) -> list[Written]:
        """The run's projected events as written, with their MACs, from the log
        (the projection says where they are)."""
        log = self._ports.log
        where = self._ports.projections.positions(run_id, log.partition_for(run_id))
        return read_projected(log, self._events_topic, run_id, where.offsets)

    def _delete(self, keys: list[str], grace: bool = True) -> int:
        """Delete payload objects no run claims, unless written within the grace
        period: objects are stored by content, so a run still going may have just
        written the same bytes, before its event (and claim) reached the
        projection. A failure leaves the object (logged)."""
        done, settled = 0, []
        recent = datetime.now(UTC) - self._grace
        for key in keys:
            try:
                written = self._blobs.written_at(key)
                if written is not None and grace and written > recent:
                    continue  # perhaps claimed again just now: a later sweep's
                if written is not None:
                    self._blobs.delete(key)
                    done += 1
                settled.append(key)
            except EsAgentsError as e:
                log.warning("payload %s not deleted: %s", key, e)
        if settled:
            self._archives.settle(settled)
        return done

    def read(self, run_id: str) -> ocf.Archive:
        """The run's archive, checked against its record."""
        row = self._archives.archived(run_id)
        if row is None:
            raise NotFound(f"run {run_id} has no archive")
        data = self._blobs.get(row.key)
        if ocf.sha256(data) != row.sha256:
            raise ArchiveBroken(f"run {run_id}: {row.key} is not the archive written")
        made = ocf.read(data)
        problems = ocf.check(made, self._codec.decode_event, row.last_seq)
        if problems:
            raise ArchiveBroken(f"run {run_id}: {'; '.join(problems)}")
        return made

    def events(self, run_id: str) -> list[Event]:
        """A purged run's events, from its archive, with the payloads it holds."""
        made = self.read(run_id)
        kept = ClaimCheck(ocf.Kept(made.payloads()))
        return [kept.restore(self._codec.decode_event(w.value)) for w in made.written()]

    def restore(self, run_id: str) -> int:
        """Put a purged run's events and payload objects back; the events restored."""
        made = self.read(run_id)
        payloads = made.payloads()
        for key, data in payloads.items():
            self._blobs.put(key, data)
        self._archives.restore(run_id, made.written(), sorted(payloads))
        return len(made.records)

    def forget(self, run_id: str) -> int:
        """Delete the run's payload objects (those no other run claims) and its
        archive; the objects deleted."""
        deleted = self._delete(self._archives.unclaim(run_id))
        row = self._archives.archived(run_id)
        if row is not None:
            deleted += self._delete([row.key], grace=False)
        return deleted

    def checks(self, run_prefix: str = "") -> dict[str, Callable[[bytes], list[str]]]:
        """For ``audit``: each purged run's check of its archive against the head
        of its chain in the log (what is wrong; nothing: an empty list)."""
        if self._ports.archives is None or self._ports.claims is None:
            return {}

        def check(run_id: str) -> Callable[[bytes], list[str]]:
            def against(head: bytes) -> list[str]:
                try:
                    made = self.read(run_id)
                except EsAgentsError as e:
                    return [f"archive: {e}"]
                if made.head != head.hex():
                    return [f"archive: it ends elsewhere than the log ({made.head})"]
                return []

            return against

        return {r: check(r) for r in self._archives.purged(run_prefix)}

    def sweep(
        self,
        agent: str,
        retention: Retention,
        now: datetime | None = None,
        limit: int = 100,
    ) -> list[str]:
        """Archive and purge the agent's runs that ended ``purge_after`` ago, and
        delete the orphaned payload objects past their grace; the runs purged (a
        run that cannot be is logged and left as it is)."""
        if self._ports.archives is None:
            return []
        self._delete(self._archives.orphaned())  # those past their grace now
        if retention.purge_after is None:
            return []
        ended_before = (now or datetime.now(UTC)) - retention.purge_after
        done = []
        for run_id in self._archives.due(agent, ended_before, limit):
            try:
                self.archive(run_id)
                done.append(run_id)
            except EsAgentsError as e:
                log.warning("run %s not archived: %s", run_id, e)
        return done
