"""The composition root: the one module that chooses and builds adapters.

``ES_AGENTS_STORE`` picks the log -- ``kafka`` (the default), ``postgres`` (the log in
Postgres tables, no broker) or ``memory`` (one process, for tests) -- and everything
else follows from settings: the model, the payload claim check, the probe. The
runtime receives the result as ``Ports`` and never names an adapter.
"""

from __future__ import annotations

import base64
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from es_agents.core.authorship import KEY_BYTES, Authenticator
from es_agents.errors import ConfigError
from es_agents.models import ModelClient
from es_agents.observability import NoTelemetry, NoTracer, Telemetry, Tracer
from es_agents.ports import NoProbe, Ports, Probe
from es_agents.settings import ModelSettings, Settings

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from es_agents.agent import Agent
    from es_agents.payloads import ClaimCheck
    from es_agents.runtime.worker import Worker
    from projectors.runs import Projector

# ruff: noqa: PLC0415 - adapters are imported only for the store that is chosen


def build_model(settings: ModelSettings | None = None) -> ModelClient:
    """The model client ``ES_AGENTS_MODEL_*`` describes, on the official SDK."""
    s = settings if settings is not None else ModelSettings()
    key = s.api_key.get_secret_value() if s.api_key is not None else None
    if s.provider == "openai":
        from es_agents.adapters.openai_model import OpenAIChatModel

        return OpenAIChatModel(s.base_url, s.name, api_key=key, timeout=s.timeout)
    if s.provider == "anthropic":
        from es_agents.adapters.anthropic_model import AnthropicModel

        return AnthropicModel(
            s.name,
            api_key=key,
            base_url=s.base_url,
            timeout=s.timeout,
            max_tokens=s.max_tokens,
        )
    raise ConfigError(f"unknown model provider {s.provider!r}")


def build_claim_check(settings: Settings) -> ClaimCheck | None:
    """The payload claim check ``ES_AGENTS_PAYLOADS`` asks for (S3 by default)."""
    from es_agents.payloads import ClaimCheck

    if settings.payloads == "off":
        return None
    if settings.store == "memory":
        return ClaimCheck(_memory(settings)["blobs"], settings.payload_threshold)
    from es_agents.adapters.s3 import S3BlobStore

    store = S3BlobStore(
        settings.s3_endpoint,
        settings.s3_bucket,
        settings.s3_access_key,
        settings.s3_secret_key.get_secret_value(),
    )
    return ClaimCheck(store, settings.payload_threshold)


def build_probe(settings: Settings) -> Probe:
    """Crash points (``ES_AGENTS_CRASH_AT``) and the acknowledgement journal, for the
    crash tests and the chaos run; a no-op otherwise."""
    crash = os.environ.get("ES_AGENTS_CRASH_AT")
    if not crash and settings.ack_journal is None:
        return NoProbe()
    from es_agents.lab.crash import CrashPoints
    from es_agents.lab.probes import LabProbe

    return LabProbe(CrashPoints(crash), settings.ack_journal)


def build_ports(
    settings: Settings,
    *,
    pool_size: int = 8,
    migrate: bool = True,
    db_timeout: float = 30.0,
    member: bool = False,
) -> Ports:
    """Every port the runtime needs, on the store the settings name. ``migrate``:
    bring the database's tables up to date now (workers, projectors); a client
    does it before its first write, and reads never do. ``db_timeout``: seconds to
    wait for a database connection before ``Unavailable``. ``member``: for a worker or
    a projector (see ``_database``)."""
    claims = build_claim_check(settings)
    restore = claims.restore if claims is not None else None
    if settings.store == "memory":
        ports = _memory_ports(settings, restore)
    elif settings.store == "postgres":
        ports = _postgres_ports(settings, restore, pool_size, db_timeout, member)
    else:
        ports = _kafka_ports(settings, restore, pool_size, db_timeout, member)
    if migrate:
        ports.migrate()
    authenticate(settings, ports)
    ports.claims = claims
    ports.probe = build_probe(settings)
    return ports


def authenticate(settings: Settings, ports: Ports) -> None:
    """Give the log and the projections the writer key (again after migrations
    that made its table: a client built before them has none)."""
    auth = _writer_auth(settings, ports)
    ports.log.auth = auth
    if hasattr(ports.projections, "auth"):  # projections that can verify
        ports.projections.auth = auth
    if hasattr(ports.projections, "log"):  # the events before a run's tail
        ports.projections.log = ports.log


def _writer_auth(settings: Settings, ports: Ports) -> Authenticator | None:
    """The writer key set in the settings, or the database's (made there by the
    first process that may)."""
    if settings.writer_key is None:
        return ports.writer_keys()
    try:
        key = base64.b64decode(settings.writer_key.get_secret_value(), validate=True)
    except ValueError as e:
        raise ConfigError("ES_AGENTS_WRITER_KEY: not base64") from e
    if len(key) < KEY_BYTES:
        raise ConfigError(f"ES_AGENTS_WRITER_KEY: {len(key)} bytes, not {KEY_BYTES}")
    return Authenticator({"set": key}, "set")


def _database(
    settings: Settings, pool_size: int, timeout: float, member: bool = False
) -> Any:
    """``member``: for a worker or a projector, which also ends the sessions a
    stalled member left in the middle of a transaction (``postgres_stalls``)."""
    from es_agents.adapters.postgres import Database

    url = settings.database_url.get_secret_value()
    # A member silent for the session timeout has lost its partitions: its open
    # transactions go too, so they cannot block the member that takes them over.
    idle = settings.kafka.session_timeout_ms / 1000
    return Database(
        url,
        max_size=pool_size,
        timeout=timeout,
        idle_in_transaction=idle,
        end_stalled=idle if member else None,
    )


def _postgres_read_side(settings: Settings, db: Any, decode: Any) -> dict[str, Any]:
    from es_agents.adapters.postgres import PostgresEffectLedger, PostgresTimers
    from es_agents.adapters.postgres_archives import PostgresArchives
    from es_agents.adapters.postgres_commands import PostgresCommandBook
    from es_agents.adapters.postgres_flow import PostgresFlow
    from es_agents.adapters.postgres_keys import PostgresKeyring
    from es_agents.adapters.postgres_projections import PostgresProjections
    from es_agents.adapters.postgres_rates import PostgresModelRates
    from es_agents.adapters.postgres_schedules import PostgresSchedules
    from es_agents.adapters.postgres_vault import PostgresVault

    kafka = settings.kafka
    return {
        "keyring": PostgresKeyring(db),
        "vault": PostgresVault(db, settings.master),
        "projections": PostgresProjections(
            db, decode, settings.projector_group_id, kafka.events_topic
        ),
        "ledger": PostgresEffectLedger(db),
        "timers": PostgresTimers(db),
        "schedules": PostgresSchedules(db, kafka.topic_prefix),
        "flow": PostgresFlow(db, kafka.topic_prefix),
        "rates": PostgresModelRates(db, kafka.topic_prefix),
        "book": PostgresCommandBook(db, kafka.topic_prefix),
        "archives": PostgresArchives(db, decode),
    }


def _kafka_ports(
    settings: Settings, restore: Any, pool_size: int, db_timeout: float, member: bool
) -> Ports:
    from es_agents.adapters.fencing import PartitionWriter
    from es_agents.adapters.kafka import KafkaEventLog
    from es_agents.adapters.kafka_epochs import EpochWriter
    from es_agents.adapters.kafka_source import KafkaSource
    from es_agents.adapters.postgres import check_layout
    from es_agents.dead_letters import DeadLetterQueue
    from es_agents.runtime.ownership import LogWriter

    kafka = settings.kafka
    db = _database(settings, pool_size, db_timeout, member)
    log = KafkaEventLog(kafka, restore=restore, keep_tails=member)
    dlq = DeadLetterQueue(log, kafka.dlq_topic)

    def subscribe(topic: str, group: str, decode: Any, **kw: Any) -> Any:
        return KafkaSource(kafka, topic, group, decode, dlq, **kw)

    def writer(group: str, partition: int, take_epoch: Callable[[], int]) -> Any:
        if settings.fencing == "epochs":
            projections = side["projections"]
            return EpochWriter(
                log,
                group,
                partition,
                take_epoch,
                epoch_now=lambda: projections.current_epoch(group, partition),
            )
        if settings.fencing == "transactions":
            return PartitionWriter(kafka, log.codec, group, partition, take_epoch())
        return LogWriter(log, take_epoch())

    def topics() -> dict[str, int]:
        from es_agents.adapters.kafka_admin import ensure_topics
        from es_agents.adapters.kafka_deltas import ensure_stream_topic

        check_layout(db, kafka.topic_prefix, None, "kafka")
        counts = ensure_topics(kafka)
        ensure_stream_topic(kafka)  # the deltas' own (kept an hour; not the log)
        check_layout(db, kafka.topic_prefix, counts[kafka.events_topic], "kafka")
        return counts

    from es_agents.adapters.kafka_deltas import KafkaDeltas
    from es_agents.adapters.postgres_writer_keys import writer_keys

    side = _postgres_read_side(settings, db, log.decode_event)
    return Ports(
        store="kafka",
        writer_keys=lambda: writer_keys(db),
        log=log,
        subscribe=subscribe,
        writer=writer,
        deltas=KafkaDeltas(kafka),
        ensure_topics=topics,
        migrate=db.migrate,
        closers=[side["book"].close, db.close],
        **side,
    )


def _postgres_ports(
    settings: Settings, restore: Any, pool_size: int, db_timeout: float, member: bool
) -> Ports:
    from es_agents.adapters.postgres_log import (
        PostgresEventLog,
        PostgresPartitionWriter,
        ensure_topics,
    )
    from es_agents.adapters.postgres_source import PostgresSource
    from es_agents.dead_letters import DeadLetterQueue
    from es_agents.runtime.ownership import LogWriter

    kafka = settings.kafka
    db = _database(settings, pool_size, db_timeout, member)
    log = PostgresEventLog(db, kafka, restore=restore)
    dlq = DeadLetterQueue(log, kafka.dlq_topic)
    session = kafka.session_timeout_ms / 1000

    def subscribe(topic: str, group: str, decode: Any, **kw: Any) -> Any:
        return PostgresSource(
            db, topic, group, decode, dlq, session_timeout=session, **kw
        )

    def writer(group: str, partition: int, take_epoch: Callable[[], int]) -> Any:
        if settings.fencing == "none":
            return LogWriter(log, take_epoch())
        # Fenced in the database: an append checks the epoch in its transaction.
        return PostgresPartitionWriter(log, group, partition, take_epoch())

    def topics() -> dict[str, int]:
        from es_agents.adapters.postgres import check_layout

        check_layout(db, kafka.topic_prefix, None, "postgres")
        counts = ensure_topics(db, kafka)
        check_layout(db, kafka.topic_prefix, counts[kafka.events_topic], "postgres")
        return counts

    from es_agents.adapters.postgres_deltas import PostgresDeltas
    from es_agents.adapters.postgres_writer_keys import writer_keys

    side = _postgres_read_side(settings, db, log.decode_event)
    return Ports(
        store="postgres",
        deltas=PostgresDeltas(db, kafka.topic_prefix),
        writer_keys=lambda: writer_keys(db),
        log=log,
        subscribe=subscribe,
        writer=writer,
        ensure_topics=topics,
        migrate=db.migrate,
        closers=[side["book"].close, db.close],
        **side,
    )


_MEMORY: dict[str, dict[str, Any]] = {}


def _memory(settings: Settings) -> dict[str, Any]:
    """One memory store per topic prefix, shared by everything in this process."""
    from es_agents.adapters.memory import (
        InMemoryBlobStore,
        MemoryCommandBook,
        MemoryDeltas,
        MemoryEffectLedger,
        MemorySchedules,
        MemoryTimers,
    )
    from es_agents.adapters.memory_flow import MemoryFlow
    from es_agents.adapters.memory_log import MemoryBroker
    from es_agents.adapters.memory_rates import MemoryModelRates
    from es_agents.approvals import MemoryKeyring
    from es_agents.vault import MemoryVault

    prefix = settings.kafka.topic_prefix
    if prefix not in _MEMORY:
        _MEMORY[prefix] = {
            "broker": MemoryBroker(settings.kafka.partitions),
            "ledger": MemoryEffectLedger(),
            "timers": MemoryTimers(),
            "schedules": MemorySchedules(),
            "flow": MemoryFlow(),
            "rates": MemoryModelRates(),
            "book": MemoryCommandBook(),
            "blobs": InMemoryBlobStore(),
            "keyring": MemoryKeyring(),
            "vault": MemoryVault(),
            "auth": Authenticator({"memory": os.urandom(KEY_BYTES)}, "memory"),
            "deltas": MemoryDeltas(),
        }
    return _MEMORY[prefix]


def _memory_ports(settings: Settings, restore: Any) -> Ports:
    from es_agents.adapters.memory import MemoryProjections
    from es_agents.adapters.memory_log import (
        MemoryEventLog,
        MemoryPartitionWriter,
        MemorySource,
    )
    from es_agents.dead_letters import DeadLetterQueue
    from es_agents.runtime.ownership import LogWriter

    kafka = settings.kafka
    shared = _memory(settings)
    broker = shared["broker"]
    log = MemoryEventLog(
        broker, kafka.events_topic, kafka.commands_topic, restore=restore
    )
    dlq = DeadLetterQueue(log, kafka.dlq_topic)

    def subscribe(topic: str, group: str, decode: Any, **kw: Any) -> Any:
        return MemorySource(broker, topic, group, decode, dlq, **kw)

    def writer(group: str, partition: int, take_epoch: Callable[[], int]) -> Any:
        if settings.fencing == "none":
            return LogWriter(log, take_epoch())
        return MemoryPartitionWriter(log, group, partition, take_epoch())

    def ensure_topics() -> dict[str, int]:
        names = kafka.topics
        for topic in names:
            broker.create(topic)
        return {t: broker.partition_count(t) for t in names}

    ensure_topics()
    return Ports(
        store="memory",
        log=log,
        subscribe=subscribe,
        writer=writer,
        ensure_topics=ensure_topics,
        projections=MemoryProjections(broker.next_epoch, broker.current_epoch),
        ledger=shared["ledger"],
        timers=shared["timers"],
        schedules=shared["schedules"],
        flow=shared["flow"],
        rates=shared["rates"],
        book=shared["book"],
        keyring=shared["keyring"],
        vault=shared["vault"],
        writer_keys=lambda: shared["auth"],
        deltas=shared["deltas"],
    )


def build_telemetry(settings: Settings) -> Telemetry:
    """Prometheus metrics served over HTTP when ``ES_AGENTS_METRICS_PORT`` is set;
    nothing otherwise."""
    if settings.metrics_port is None:
        return NoTelemetry()
    from es_agents.adapters.prometheus import PrometheusTelemetry

    telemetry = PrometheusTelemetry()
    server = telemetry.serve(settings.metrics_port, settings.metrics_addr)
    log.info(
        "metrics on http://%s:%d/metrics", settings.metrics_addr, server.server_port
    )
    return telemetry


def build_tracer(settings: Settings) -> Tracer:
    """OpenTelemetry spans exported by OTLP when ``ES_AGENTS_TRACING=otlp``."""
    if settings.tracing == "off":
        return NoTracer()
    from es_agents.adapters.opentelemetry import otlp_tracer

    return otlp_tracer()


def build_worker(
    settings: Settings,
    agent: Agent,
    *,
    group_id: str | None = None,
    instance_id: str | None = None,
    until_idle: bool = False,
    idle_seconds: float = 1.0,
    threads: int | None = None,
) -> Worker:
    """A worker for ``agent`` on the configured store (topics created if missing),
    wired here: its ports, the partitions' ownership, the offsets it may commit,
    the runs' context and the pools their calls run on. ``threads``: tool and
    model calls at once (default ``ES_AGENTS_TOOL_CALLS_PER_WORKER``)."""
    from es_agents.dead_letters import DeadLetterQueue
    from es_agents.runtime.context import run_context
    from es_agents.runtime.loader import RunLoader
    from es_agents.runtime.offsets import OffsetTracker
    from es_agents.runtime.others import OtherRuns
    from es_agents.runtime.ownership import Ownership
    from es_agents.runtime.pools import Calls
    from es_agents.runtime.worker import Worker

    ports = build_ports(settings, member=True)
    ports.ensure_topics()
    ports.telemetry = build_telemetry(settings)
    ports.tracer = build_tracer(settings)
    kafka = settings.kafka
    group = group_id or f"{kafka.topic_prefix}.workers.{agent.name}"
    ownership = Ownership(group, ports.projections, ports.writer)
    tracker = OffsetTracker()
    others = OtherRuns(ports.book)
    ctx = run_context(
        agent,
        ports,
        settings,
        owned=ownership,
        loader=RunLoader(ports.projections, ports.log, kafka.events_topic),
        dlq=DeadLetterQueue(ports.log, kafka.dlq_topic, ports.telemetry),
        done=tracker.done,
        start_agent=others.agent_of,
        calls=Calls(threads or settings.tool_calls_per_worker),
    )
    return Worker(
        settings,
        agent,
        ports,
        ctx,
        ownership,
        tracker,
        others,
        group=group,
        instance_id=instance_id,
        until_idle=until_idle,
        idle_seconds=idle_seconds,
    )


def build_projector(settings: Settings, **options: Any) -> Projector:
    """The projector of the configured store's events topic into Postgres."""
    from es_agents.adapters.postgres import Database
    from projectors.runs import Projector

    if settings.store == "memory":
        raise ConfigError("the memory store has no projector (it projects nothing)")
    ports = build_ports(settings, pool_size=4, member=True)
    ports.ensure_topics()
    db = Database(settings.database_url.get_secret_value())
    return Projector(
        settings,
        db,
        ports.log,
        ports.subscribe,
        probe=ports.probe,
        closers=[ports.close],
        telemetry=build_telemetry(settings),
        **options,
    )


def build_client_ports(settings: Settings) -> Ports:
    """A client's ports: a small pool, no probe, no migrations; the brokers and the
    database answer within ``connect_timeout`` or ``Unavailable`` says which not."""
    if settings.store == "kafka":
        from es_agents.adapters.kafka_probe import reachable

        reachable(settings.kafka, settings.connect_timeout)
    ports = build_ports(
        settings, pool_size=2, migrate=False, db_timeout=settings.connect_timeout
    )
    ports.probe = NoProbe()
    return ports


def ensure_topics(settings: Settings, fix_retention: bool = False) -> dict[str, int]:
    """Create and check the topics (and, on the Postgres store, the tables); the
    store and partition count runs were placed with are recorded, or checked."""
    if settings.store == "kafka":
        from es_agents.adapters.kafka_admin import ensure_topics as kafka_topics
        from es_agents.adapters.kafka_deltas import ensure_stream_topic
        from es_agents.adapters.postgres import Database, check_layout

        prefix = settings.kafka.topic_prefix
        db = Database(
            settings.database_url.get_secret_value(),
            max_size=1,
            timeout=settings.connect_timeout,
        )
        try:
            db.migrate()
            check_layout(db, prefix, None, "kafka")
            counts = kafka_topics(settings.kafka, fix_retention=fix_retention)
            ensure_stream_topic(settings.kafka)  # the answers' stream (kept an hour)
            check_layout(db, prefix, counts[settings.kafka.events_topic], "kafka")
        finally:
            db.close()
        return counts
    ports = build_ports(settings, pool_size=1)
    try:
        return ports.ensure_topics()
    finally:
        ports.close()


def kafka_acls(
    settings: Settings, worker: str, client: str, projector: str, apply: bool
) -> list[Any]:
    """The Kafka ACLs of the topic prefix for the three roles; created when
    ``apply`` (``es_agents.adapters.kafka_acls``)."""
    from es_agents.adapters import kafka_acls as acls

    wanted = acls.grants(
        settings.kafka, worker=worker, client=client, projector=projector
    )
    if apply:
        acls.apply(settings.kafka, wanted)
    return wanted


def migrate(settings: Settings, dry_run: bool = False) -> list[Any]:
    """Apply the SQL migrations not applied yet (or list them: ``dry_run``)."""
    from es_agents.adapters.postgres import Database

    db = Database(settings.database_url.get_secret_value(), max_size=1)
    try:
        return db.migrate(dry_run=dry_run)
    finally:
        db.close()
