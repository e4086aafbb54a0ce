"""The dev stack's Kafka with authentication and ACLs (``dev up --acls``).

Every listener asks who is there: clients and brokers authenticate with SASL/SCRAM
on the client port, the KRaft controllers with SASL/PLAIN on theirs (KRaft takes no
SCRAM there). Four users are made when the broker's storage is formatted, each with a
random password kept in ``HOME/kafka-acls/users.json`` (mode 0600):

- ``es-admin``: the brokers' own principal and the only super user; it creates the
  topics and the ACLs;
- ``es-worker``, ``es-client``, ``es-projector``: the three roles of
  ``es_agents.adapters.kafka_acls`` -- only workers write events, clients write
  nothing but commands, projectors only dead letters.

The StandardAuthorizer refuses whatever no ACL allows. The listeners are SASL over
plain TCP on 127.0.0.1 (SCRAM does not send the password; the records travel in
clear): a production cluster runs SASL_SSL, which the settings take as well.
"""

from __future__ import annotations

import json
import os
import secrets
from typing import Literal

from es_agents.dev.config import DevSettings
from es_agents.errors import ConfigError

Role = Literal["admin", "worker", "client", "projector"]
ROLES: tuple[Role, ...] = ("admin", "worker", "client", "projector")
MECHANISM = "SCRAM-SHA-256"
LISTENER = "SASL_PLAINTEXT"


def user(role: Role) -> str:
    return f"es-{role}"


def passwords(dev: DevSettings) -> dict[Role, str]:
    """Each role's password: made once (mode 0600), then read."""
    path = dev.kafka_home / "users.json"
    if path.exists():
        known = json.loads(path.read_text())
        return {role: str(known[user(role)]) for role in ROLES}
    made: dict[Role, str] = {role: secrets.token_urlsafe(18) for role in ROLES}
    path.parent.mkdir(parents=True, exist_ok=True)
    aside = path.with_suffix(f".{os.getpid()}")
    fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump({user(role): made[role] for role in ROLES}, out, indent=2)
    aside.replace(path)
    return made


def broker_properties(dev: DevSettings, node: int) -> dict[str, str]:
    """Node ``node``'s listeners, SASL and authorizer settings (over its defaults)."""
    admin, password = user("admin"), passwords(dev)["admin"]
    scram = "org.apache.kafka.common.security.scram.ScramLoginModule"
    plain = "org.apache.kafka.common.security.plain.PlainLoginModule"
    port, controller = dev.kafka_ports(node)
    return {
        "listeners": f"{LISTENER}://{dev.host}:{port},"
        f"CONTROLLER://{dev.host}:{controller}",
        "advertised.listeners": f"{LISTENER}://{dev.host}:{port}",
        "listener.security.protocol.map": (
            f"{LISTENER}:{LISTENER},CONTROLLER:{LISTENER}"
        ),
        "inter.broker.listener.name": LISTENER,
        "sasl.enabled.mechanisms": MECHANISM,
        "sasl.mechanism.inter.broker.protocol": MECHANISM,
        f"listener.name.{LISTENER.lower()}.{MECHANISM.lower()}.sasl.jaas.config": (
            f'{scram} required username="{admin}" password="{password}";'
        ),
        "sasl.mechanism.controller.protocol": "PLAIN",
        "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.controller.plain.sasl.jaas.config": (
            f'{plain} required username="{admin}" password="{password}" '
            f'user_{admin}="{password}";'
        ),
        "authorizer.class.name": (
            "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
        ),
        "allow.everyone.if.no.acl.found": "false",
        "super.users": f"User:{admin}",
    }


def format_args(dev: DevSettings) -> tuple[str, ...]:
    """``kafka-storage format`` arguments that make the four SCRAM users."""
    return tuple(
        arg
        for role, password in passwords(dev).items()
        for arg in (
            "--add-scram",
            f"{MECHANISM}=[name={user(role)},password={password}]",
        )
    )


def reach(dev: DevSettings) -> dict[str, str]:
    """The ``ES_AGENTS_*`` settings that reach the dev stack's brokers."""
    replicas, min_isr = dev.replication
    return {
        "ES_AGENTS_BOOTSTRAP_SERVERS": dev.kafka_bootstrap,
        "ES_AGENTS_REPLICATION_FACTOR": str(replicas),
        "ES_AGENTS_MIN_INSYNC_REPLICAS": str(min_isr),
    }


def environment(dev: DevSettings, role: Role) -> dict[str, str]:
    """``reach`` as ``role`` on the secured Kafka."""
    if role not in ROLES:
        raise ConfigError(f"a role is one of {', '.join(ROLES)}, not {role!r}")
    return {
        **reach(dev),
        "ES_AGENTS_SECURITY_PROTOCOL": LISTENER,
        "ES_AGENTS_SASL_MECHANISM": MECHANISM,
        "ES_AGENTS_SASL_USERNAME": user(role),
        "ES_AGENTS_SASL_PASSWORD": passwords(dev)[role],
    }


def librdkafka(dev: DevSettings, role: Role = "admin") -> dict[str, str]:
    """A librdkafka configuration that connects as ``role``."""
    return {
        "bootstrap.servers": dev.kafka_bootstrap,
        "security.protocol": LISTENER,
        "sasl.mechanism": MECHANISM,
        "sasl.username": user(role),
        "sasl.password": passwords(dev)[role],
    }


def provision(dev: DevSettings, **overrides: object) -> int:
    """As ``es-admin``: the topics of the topic prefix (from the environment, as
    every command reads it) and the ACLs of the three roles on them; how many ACLs.
    Idempotent."""
    from es_agents.app import ensure_topics, kafka_acls  # noqa: PLC0415
    from es_agents.settings import load_settings  # noqa: PLC0415

    replicas, min_isr = dev.replication
    settings = load_settings(
        bootstrap_servers=dev.kafka_bootstrap,
        replication_factor=replicas,
        min_insync_replicas=min_isr,
        security_protocol=LISTENER,
        sasl_mechanism=MECHANISM,
        sasl_username=user("admin"),
        sasl_password=passwords(dev)["admin"],
        **{"database_url": dev.database_url, **overrides},
    )
    ensure_topics(settings)
    made = kafka_acls(
        settings,
        f"User:{user('worker')}",
        f"User:{user('client')}",
        f"User:{user('projector')}",
        apply=True,
    )
    return len(made)
