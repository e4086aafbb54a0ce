"""Kafka with SASL/SCRAM over TLS: a broker of this test's own (the dev stack's
jars), its certificates made by the test, a SCRAM user made at format time. The
worker, the projector and the CLI reach it with settings from the environment only;
a wrong password fails within the connect timeout and says why."""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from confluent_kafka import Producer
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import NameOID

from es_agents.dev import DevStack, cluster
from es_agents.dev.config import DevSettings
from es_agents.dev.kafka import DevKafka
from es_agents.lab.demo import cli, run_worker
from tests.test_support import free_port

pytestmark = pytest.mark.integration

USER, PASSWORD, STORE_PASSWORD = "es-worker", "scram-secret-1", "store-secret"


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _certificates(home: Path) -> tuple[Path, Path]:
    """A CA (PEM, for the clients) and the broker's key and certificate signed by
    it for 127.0.0.1 (PKCS#12, for the broker)."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("es-agents test CA"))
        .issuer_name(_name("es-agents test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("127.0.0.1"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    x509.DNSName("localhost"),
                ]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_pem = home / "ca.pem"
    ca_pem.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    store = home / "broker.p12"
    store.write_bytes(
        pkcs12.serialize_key_and_certificates(
            b"broker",
            key,
            cert,
            [ca],
            serialization.BestAvailableEncryption(STORE_PASSWORD.encode()),
        )
    )
    return ca_pem, store


@contextmanager
def _broker(
    dev_stack: DevStack, home: Path, users: dict[str, str]
) -> Iterator[tuple[str, Path]]:
    """A broker whose only client listener is SASL_SSL, with SCRAM ``users``
    (name -> password)."""
    home.mkdir()
    ca_pem, store = _certificates(home)
    port, secure_port, controller = free_port(), free_port(), free_port()
    dev = DevSettings(
        home=home, kafka_port=port, kafka_controller_port=controller, kafka_heap="256m"
    )
    jaas = "org.apache.kafka.common.security.scram.ScramLoginModule required ;"
    scram = [
        arg
        for name, password in users.items()
        for arg in ("--add-scram", f"SCRAM-SHA-256=[name={name},password={password}]")
    ]
    broker = DevKafka(
        dev,
        lib=dev_stack.kafka.lib,
        extra={
            # PLAINTEXT stays for the broker itself (and its readiness check only).
            "listeners": f"PLAINTEXT://127.0.0.1:{port},"
            f"SASL_SSL://127.0.0.1:{secure_port},CONTROLLER://127.0.0.1:{controller}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port},"
            f"SASL_SSL://127.0.0.1:{secure_port}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,"
            "SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT",
            "sasl.enabled.mechanisms": "SCRAM-SHA-256",
            "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config": jaas,
            "ssl.keystore.type": "PKCS12",
            "ssl.keystore.location": str(store),
            "ssl.keystore.password": STORE_PASSWORD,
            "ssl.key.password": STORE_PASSWORD,
        },
        format_args=tuple(scram),
    )
    broker.start()
    try:
        yield f"127.0.0.1:{secure_port}", ca_pem
    finally:
        broker.stop()


@pytest.fixture
def secured(dev_stack: DevStack, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A broker whose only client listener is SASL_SSL: (its address, the CA)."""
    with _broker(dev_stack, tmp_path / "secured", {USER: PASSWORD}) as b:
        yield b


def _over(
    address: str, ca: Path, env: dict[str, str], user: str, password: str = ""
) -> dict[str, str]:
    """``env`` over the SASL_SSL broker as ``user`` (password: ``<user>-secret``)."""
    return {
        **env,
        "ES_AGENTS_BOOTSTRAP_SERVERS": address,
        # This test's own broker is a single node, whatever the dev stack is.
        "ES_AGENTS_REPLICATION_FACTOR": "1",
        "ES_AGENTS_MIN_INSYNC_REPLICAS": "1",
        "ES_AGENTS_SECURITY_PROTOCOL": "SASL_SSL",
        "ES_AGENTS_SASL_MECHANISM": "SCRAM-SHA-256",
        "ES_AGENTS_SASL_USERNAME": user,
        "ES_AGENTS_SASL_PASSWORD": password or f"{user}-secret",
        "ES_AGENTS_SSL_CA_LOCATION": str(ca),
        "ES_AGENTS_CONNECT_TIMEOUT": "5",
    }


def _to_the_gate(
    client: dict[str, str],
    worker: dict[str, str],
    projector: dict[str, str],
    topic: str,
) -> str:
    """A run started (queued before any worker), worked to its gate and projected,
    each by its own environment; its id, once ``status`` says paused."""
    started = cli(client, "start", "research", "--input", f'{{"topic": "{topic}"}}',
                  "--no-wait", "--queue")  # fmt: skip
    assert started.returncode == 0, started.stderr[-2000:]
    run = started.stdout.strip()
    worked = run_worker(worker, agent="tests.agents:gated")
    assert worked.returncode == 0, worked.stderr[-2000:]
    projected = cli(projector, "projector", "--until-caught-up")
    assert projected.returncode == 0, projected.stderr[-2000:]
    status = cli(client, "status", run, "-o", "json")
    assert status.returncode == 0, status.stderr[-2000:]
    assert json.loads(status.stdout)["status"] == "paused"
    return run


@pytest.fixture
def acl_home(dev_stack: DevStack, tmp_path: Path) -> Iterator[dict[str, str]]:
    """A dev stack's Kafka made as ``dev up --acls`` makes it, in a home of this
    test's own (the shared Postgres): the ``ES_AGENTS_DEV_*`` settings that find it."""
    home = tmp_path / "acl"
    place = {
        "ES_AGENTS_DEV_HOME": str(home),
        "ES_AGENTS_DEV_KAFKA_PORT": str(free_port()),
        "ES_AGENTS_DEV_KAFKA_CONTROLLER_PORT": str(free_port()),
        "ES_AGENTS_DEV_KAFKA_HEAP": "256m",
        "ES_AGENTS_DEV_KAFKA_BROKERS": "1",
    }
    dev = DevSettings(
        home=home,
        kafka_port=int(place["ES_AGENTS_DEV_KAFKA_PORT"]),
        kafka_controller_port=int(place["ES_AGENTS_DEV_KAFKA_CONTROLLER_PORT"]),
        kafka_heap="256m",
        kafka_brokers=1,
        kafka_acls=True,
    )
    cluster.prepare(dev)  # records that ACLs are on, as `dev up --acls` does
    broker = DevKafka(dev, lib=dev_stack.kafka.lib)
    broker.start()
    try:
        yield place
    finally:
        broker.stop()


def _role(env: dict[str, str], place: dict[str, str], role: str) -> dict[str, str]:
    """``env`` as ``role``, with the settings ``dev env --role`` prints."""
    printed = cli({**env, **place}, "dev", "env", "--role", role, "-o", "json")
    assert printed.returncode == 0, printed.stderr[-2000:]
    return {**env, **json.loads(printed.stdout)}


def _produce(env: dict[str, str], topic: str) -> str:
    """Write one record to ``topic`` as ``env``'s principal: the error, or ''."""
    conf = {
        "bootstrap.servers": env["ES_AGENTS_BOOTSTRAP_SERVERS"],
        "security.protocol": env["ES_AGENTS_SECURITY_PROTOCOL"],
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": env["ES_AGENTS_SASL_USERNAME"],
        "sasl.password": env["ES_AGENTS_SASL_PASSWORD"],
        "message.timeout.ms": 10_000,
    }
    errors: list[str] = []
    producer = Producer(conf)
    producer.produce(
        topic,
        key=b"run-forged",
        value=b"forged",
        on_delivery=lambda err, _msg: errors.append(str(err) if err else ""),
    )
    producer.flush(20)
    assert errors, "no delivery report"
    return errors[0]


def test_dev_stack_with_acls_lets_only_workers_write_events(
    acl_home: dict[str, str], env: dict[str, str]
) -> None:
    admin, worker, client, projector = (
        _role(env, acl_home, role)
        for role in ("admin", "worker", "client", "projector")
    )
    assert client["ES_AGENTS_SASL_USERNAME"] == "es-client"
    assert client["ES_AGENTS_SASL_PASSWORD"] != worker["ES_AGENTS_SASL_PASSWORD"]
    # What `dev up --acls` does after the broker answers: topics and ACLs, as admin.
    assert cli(admin, "topics", "-o", "json").returncode == 0
    made = cli(
        admin, "acls", "--worker", "User:es-worker", "--client", "User:es-client",
        "--projector", "User:es-projector", "--apply", "-o", "json",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr[-2000:]
    assert len(json.loads(made.stdout)) >= 20
    # Each role does its work with its own principal.
    run = _to_the_gate(client, worker, projector, "acl")
    approved = cli(client, "approve", run, "--by", "ann", "--no-wait")
    assert approved.returncode == 0, approved.stderr[-2000:]
    assert run_worker(worker, agent="tests.agents:gated").returncode == 0
    done = cli(client, "status", run, "-o", "json")
    assert json.loads(done.stdout)["status"] == "completed"
    # What each may not write, refused by the broker.
    prefix = env["ES_AGENTS_TOPIC_PREFIX"]
    events, commands = f"{prefix}.events", f"{prefix}.commands"
    assert "TOPIC_AUTHORIZATION_FAILED" in _produce(client, events)
    assert "TOPIC_AUTHORIZATION_FAILED" in _produce(projector, events)
    assert "TOPIC_AUTHORIZATION_FAILED" in _produce(projector, commands)
    assert _produce(worker, f"{prefix}.dlq") == ""  # its own: allowed
    # Nobody gets in without a user: no password, a wrong one, or none at all.
    wrong = {**client, "ES_AGENTS_SASL_PASSWORD": "not-the-password"}
    assert cli(wrong, "status", run, "-o", "json").returncode == 4
    plain = {**client, "ES_AGENTS_SECURITY_PROTOCOL": "PLAINTEXT"}
    assert cli(plain, "status", run, "-o", "json").returncode == 4


def test_worker_projector_and_cli_over_sasl_scram_and_tls(
    secured: tuple[str, Path], env: dict[str, str]
) -> None:
    address, ca = secured
    env = _over(address, ca, env, USER, PASSWORD)
    assert cli(env, "topics", "-o", "json").returncode == 0
    run = _to_the_gate(env, env, env, "tls")

    wrong = {**env, "ES_AGENTS_SASL_PASSWORD": "not-the-password"}
    began = time.monotonic()
    refused = cli(wrong, "status", run, "-o", "json")
    took = time.monotonic() - began
    assert refused.returncode == 4, refused.stdout + refused.stderr[-2000:]
    assert "Authentication failed" in json.loads(refused.stdout)["error"]
    assert took < 15, took
    plain = {**env, "ES_AGENTS_SECURITY_PROTOCOL": "PLAINTEXT"}
    assert cli(plain, "status", run, "-o", "json").returncode == 4
