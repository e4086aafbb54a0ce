"""Kafka ACLs for one topic prefix: which principal may write which topic.

Writer MACs make a record nobody with the writer key wrote count for nothing; ACLs
keep it off the topic in the first place. Three roles, each a principal (a SASL
user, ``User:name``):

- **worker**: writes events, its own commands (timers, schedules, admissions) and
  dead letters, and the stream of answers;
- **client**: writes commands only;
- **projector**: writes dead letters only.

All three read and describe every topic of the prefix and use consumer groups (and
the worker transactional ids) named after it: every group and transactional id
es-agents makes starts with ``PREFIX.``, so those bindings are PREFIXED. Creating the
topics (``es-agents topics``, the answers' stream included) and the ACLs
(``es-agents acls --apply``) is for an administrator: a principal given
``super.users`` on the brokers; no role creates anything.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from confluent_kafka import KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from es_agents.adapters.kafka_producer import _client
from es_agents.errors import ConfigError, Unavailable
from es_agents.settings import KafkaSettings

READ = (AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DESCRIBE_CONFIGS)
CLUSTER = "kafka-cluster"


@dataclass(frozen=True)
class Grant:
    principal: str
    resource: str  # topic | group | transactional_id | cluster
    name: str
    pattern: str  # literal | prefixed
    operation: str

    def binding(self) -> AclBinding:
        return AclBinding(
            {
                "topic": ResourceType.TOPIC,
                "group": ResourceType.GROUP,
                "transactional_id": ResourceType.TRANSACTIONAL_ID,
                "cluster": ResourceType.BROKER,  # Kafka's CLUSTER resource
            }[self.resource],
            self.name,
            {
                "literal": ResourcePatternType.LITERAL,
                "prefixed": ResourcePatternType.PREFIXED,
            }[self.pattern],
            self.principal,
            "*",
            AclOperation[self.operation],
            AclPermissionType.ALLOW,
        )


def _principal(value: str) -> str:
    if not value.startswith("User:") or len(value) <= len("User:"):
        raise ConfigError(f"a principal is User:NAME, not {value!r}")
    return value


def grants(
    settings: KafkaSettings, *, worker: str, client: str, projector: str
) -> list[Grant]:
    """The ACLs of the three roles on ``settings``' topic prefix."""
    prefix = f"{settings.topic_prefix}."
    out: list[Grant] = []

    def allow(who: str, resource: str, name: str, pattern: str, *ops: str) -> None:
        out.extend(Grant(who, resource, name, pattern, op) for op in ops)

    reads = [op.name for op in READ]
    for who in (_principal(worker), _principal(client), _principal(projector)):
        allow(who, "topic", prefix, "prefixed", *reads)
        allow(who, "group", prefix, "prefixed", "READ", "DESCRIBE")
    allow(worker, "topic", settings.events_topic, "literal", "WRITE")
    allow(worker, "topic", settings.commands_topic, "literal", "WRITE")
    allow(worker, "topic", settings.dlq_topic, "literal", "WRITE")
    allow(worker, "topic", settings.stream_topic, "literal", "WRITE")
    allow(worker, "transactional_id", prefix, "prefixed", "WRITE", "DESCRIBE")
    allow(client, "topic", settings.commands_topic, "literal", "WRITE")
    allow(projector, "topic", settings.dlq_topic, "literal", "WRITE")
    for who in (worker, client, projector):  # idempotent producers
        allow(who, "cluster", CLUSTER, "literal", "IDEMPOTENT_WRITE")
    return out


def apply(settings: KafkaSettings, wanted: Iterable[Grant], timeout: float = 30) -> int:
    """Create the bindings (creating one that exists changes nothing); how many."""
    bindings = [g.binding() for g in wanted]
    admin = AdminClient(_client(settings.to_librdkafka()))
    try:
        for future in admin.create_acls(bindings, request_timeout=timeout).values():
            future.result(timeout)
    except KafkaException as e:
        raise Unavailable(f"kafka at {settings.bootstrap_servers}: {e}") from e
    return len(bindings)
