"""Kafka topics: created with retention forever, checked for partition counts and
for anything that would expire records."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from es_agents.adapters.kafka import _NotYetKnown
from es_agents.adapters.kafka_producer import _client
from es_agents.errors import ConfigError, Unavailable
from es_agents.retry import retrying
from es_agents.settings import KafkaSettings

log = logging.getLogger(__name__)

# The log is the system of record: nothing in it may ever expire.
FOREVER = {"retention.ms": "-1", "retention.bytes": "-1"}


def list_topics(admin: AdminClient, timeout: float) -> Any:
    """The cluster's topics (metadata), with a bound of our own: librdkafka's
    timeout was seen not to fire (a test waited 540 s in ``list_topics`` with
    ``timeout=30``, the broker serving everyone else). A call still stuck after
    ``timeout`` + 5 s is left to its thread and ``Unavailable`` raised."""
    answer: dict[str, Any] = {}

    def ask() -> None:
        try:
            answer["topics"] = admin.list_topics(timeout=timeout).topics
        except KafkaException as e:
            answer["error"] = e

    thread = threading.Thread(target=ask, daemon=True, name="es-metadata")
    thread.start()
    thread.join(timeout + 5)
    if "error" in answer:
        raise Unavailable(f"kafka metadata: {answer['error']}") from answer["error"]
    if "topics" not in answer:
        raise Unavailable(f"kafka metadata: no answer in {timeout + 5:.0f} s")
    return answer["topics"]


def ensure_topics(
    settings: KafkaSettings, timeout: float = 30.0, fix_retention: bool = False
) -> dict[str, int]:
    """Create the commands, events and DLQ topics that are missing (retention
    forever, replication and ``min.insync.replicas`` from settings), and check the
    ones that exist: commands and events must have the same partition count, and no
    topic may expire records. Returns each topic's partition count.

    The partition count of an existing topic is the topic's own; the configured one
    only applies when creating.
    """
    topics = settings.topics

    def new_admin() -> AdminClient:  # a stuck request is asked again by a new one
        return AdminClient(_client(settings.to_librdkafka()))

    for attempt in (1, 2):  # a stuck metadata call: once more, with a new client
        admin = new_admin()
        try:
            existing = list_topics(admin, timeout)
            break
        except Unavailable as e:
            if attempt == 2:
                raise Unavailable(f"kafka at {settings.bootstrap_servers}: {e}") from e
            log.warning("kafka at %s: %s; asking again", settings.bootstrap_servers, e)
    config = {
        **settings.topic_config,
        **FOREVER,
        "min.insync.replicas": str(settings.min_insync_replicas),
    }
    missing = [
        NewTopic(
            t,
            num_partitions=settings.partitions,
            replication_factor=settings.replication_factor,
            config=config,
        )
        for t in topics
        if t not in existing
    ]
    if missing:
        for topic, future in admin.create_topics(
            missing, request_timeout=timeout
        ).items():
            try:
                future.result(timeout)
            except KafkaException as e:
                if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise Unavailable(f"cannot create topic {topic}: {e}") from e
        existing = _wait_for_leaders(admin, topics, timeout, new_admin)
    counts = {t: len(existing[t].partitions) for t in topics if t in existing}
    commands, events = settings.commands_topic, settings.events_topic
    if counts.get(commands) != counts.get(events):
        raise ConfigError(
            f"{commands} has {counts.get(commands)} partitions and {events} has "
            f"{counts.get(events)}: a run's commands and events must share a partition"
        )
    _check_retention(admin, topics, timeout, fix_retention, new_admin)
    return counts


def delete_topics(settings: KafkaSettings, timeout: float = 30.0) -> list[str]:
    """Delete the commands, events and DLQ topics of ``settings`` -- a bench's, a
    test's or a chaos run's own, never a deployment's: the log is the system of
    record. Best effort (a broker that stays gets them back on its next clean-up):
    returns the topics it could not delete, each logged."""
    admin = AdminClient(_client(settings.to_librdkafka()))
    topics = [*settings.topics, settings.stream_topic]
    left = []
    for topic, future in admin.delete_topics(
        topics, operation_timeout=timeout, request_timeout=timeout
    ).items():
        try:
            future.result(timeout)
        except KafkaException as e:
            if e.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                log.warning("could not delete topic %s: %s", topic, e)
                left.append(topic)
        except TimeoutError:  # the broker is gone (e.g. a test stopped it)
            log.warning("could not delete topic %s within %s s", topic, timeout)
            left.append(topic)
    return left


def _describe(
    admin: AdminClient,
    topics: list[str],
    timeout: float,
    renew: Callable[[], AdminClient] | None = None,
) -> dict[str, dict[str, Any]]:
    """Each topic's config entries. On a cluster, a topic just created may be
    unknown for a moment to the broker that answers; and a request can go
    unanswered (seen on a loaded single broker: 30 s without an answer): asked
    again, each time with a part of ``timeout``, until ``timeout`` -- after an
    unanswered one, with a new client (``renew``): the old one's connection may
    be the stuck part."""
    attempt = max(timeout / 3, 1.0)

    def describe() -> dict[str, dict[str, Any]]:
        nonlocal admin
        resources = [ConfigResource(ResourceType.TOPIC, t) for t in topics]
        try:
            return {
                resource.name: future.result(attempt)
                for resource, future in admin.describe_configs(
                    resources, request_timeout=attempt
                ).items()
            }
        except TimeoutError as e:
            if renew is not None:
                admin = renew()
            raise _NotYetKnown(f"no answer within {attempt:.0f} s") from e
        except KafkaException as e:
            code = e.args[0].code()
            if code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._TIMED_OUT):
                raise _NotYetKnown(f"{e}") from e
            raise Unavailable(f"cannot read topic configs: {e}") from e

    try:
        for tried in retrying(
            1000, on=(_NotYetKnown,), initial=0.05, maximum=0.2, within=timeout
        ):
            with tried:
                return describe()
    except _NotYetKnown as e:
        raise Unavailable(f"cannot read topic configs within {timeout} s: {e}") from e
    raise AssertionError("unreachable")  # pragma: no cover - retrying raises


def _check_retention(
    admin: AdminClient,
    topics: list[str],
    timeout: float,
    fix: bool,
    renew: Callable[[], AdminClient] | None = None,
) -> None:
    """Refuse topics that would expire records (or make them keep everything)."""
    finite: dict[str, dict[str, str]] = {}
    for topic, entries in _describe(admin, topics, timeout, renew).items():
        wrong = {
            k: str(entries[k].value)
            for k, v in FOREVER.items()
            if k in entries and str(entries[k].value) != v
        }
        if wrong:
            finite[topic] = wrong
    if not finite:
        return
    if fix:
        alter = [
            ConfigResource(
                ResourceType.TOPIC,
                topic,
                incremental_configs=[
                    ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
                    for k, v in FOREVER.items()
                ],
            )
            for topic in finite
        ]
        try:
            for future in admin.incremental_alter_configs(alter).values():
                future.result(timeout)
        except KafkaException as e:
            raise Unavailable(f"cannot change topic retention: {e}") from e
        log.warning("topics %s now keep every record", ", ".join(sorted(finite)))
        return
    detail = "; ".join(
        f"{t}: {', '.join(f'{k}={v}' for k, v in c.items())}"
        for t, c in sorted(finite.items())
    )
    raise ConfigError(
        f"topics would expire records ({detail}). The log is the system of record: "
        "its topics must keep every record (retention.ms=-1, retention.bytes=-1). "
        "Fix with `es-agents topics --fix-retention` (or kafka-configs.sh --alter "
        "--entity-type topics --entity-name TOPIC --add-config "
        "retention.ms=-1,retention.bytes=-1)."
    )


def _wait_for_leaders(
    admin: AdminClient,
    topics: list[str],
    timeout: float,
    renew: Callable[[], AdminClient],
) -> Any:
    """New topics are usable once every partition has a leader in the metadata;
    polled by the retry policy for up to ``timeout`` seconds. A metadata request
    left unanswered (seen under load) is asked again, with a new client (``renew``),
    after a third of that bound."""
    current = [admin]

    def metadata() -> Any:
        try:
            existing = list_topics(current[0], timeout / 3)
        except Unavailable as e:
            current[0] = renew()
            raise _NotYetKnown(str(e)) from e
        ready = all(
            t in existing
            and existing[t].partitions
            and all(
                p.leader >= 0 and p.error is None
                for p in existing[t].partitions.values()
            )
            for t in topics
        )
        if not ready:
            raise _NotYetKnown(f"topics {topics} have partitions without a leader")
        return existing

    try:
        for tried in retrying(
            1000, on=(_NotYetKnown,), initial=0.05, maximum=0.2, within=timeout
        ):
            with tried:
                return metadata()
    except _NotYetKnown:
        pass
    return list_topics(current[0], timeout)  # the caller checks what is there
