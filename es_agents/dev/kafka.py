"""Apache Kafka (KRaft, combined broker+controller nodes) from Maven jars: one node,
or node ``i`` of a local cluster (``dev up --brokers 3``)."""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import uuid
from importlib import resources
from pathlib import Path

from es_agents.dev import secured
from es_agents.dev.config import KAFKA_VERSION, DevSettings
from es_agents.dev.process import (
    ManagedProcess,
    port_open,
    require_free_port,
    require_tool,
    run,
    wait_for,
)
from es_agents.errors import Unavailable


def new_cluster_id() -> str:
    """A random cluster id, base64url of 16 bytes as Kafka's own: one starting
    with ``-`` is drawn again (as Kafka's ``Uuid.randomUuid`` does), since a tool's
    argument parser would read it as an option (1 draw in 64)."""
    while True:
        made = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not made.startswith("-"):
            return made


class DevKafka:
    name = "kafka"

    def __init__(
        self,
        dev: DevSettings,
        *,
        node: int = 1,
        extra: dict[str, str] | None = None,
        format_args: tuple[str, ...] = (),
        lib: Path | None = None,
    ) -> None:
        """``node``: this broker's id in a cluster of ``dev.brokers``; ``extra``:
        more broker properties (listeners, TLS, SASL); ``format_args``: more for the
        storage format (``--add-scram ...``); ``lib``: jars resolved elsewhere."""
        self.dev = dev
        self.node = node
        self.cluster = dev.brokers > 1
        self.port, self.controller_port = dev.kafka_ports(node)
        home = dev.kafka_home
        self.dir = home / f"node-{node}" if self.cluster else home
        self.name = f"kafka-{node}" if self.cluster else "kafka"
        self.lib = lib or dev.root / "kafka" / f"lib-{KAFKA_VERSION}"
        self.extra = extra or {}
        self.format_args = format_args
        # How the readiness check connects: as es-admin when ACLs are on.
        self._admin: dict[str, str | int | float | bool] = {
            "bootstrap.servers": self.endpoint
        }
        if dev.acls:  # SASL/SCRAM users, the authorizer (``dev.secured``)
            self.extra = {**secured.broker_properties(dev, node), **self.extra}
            self.format_args = (*secured.format_args(dev), *format_args)
            self._admin = {**secured.librdkafka(dev), **self._admin}
        self.data = self.dir / "data"
        self.proc = ManagedProcess(
            self.name, self.dir / "kafka.pid", self.dir / "broker.log"
        )

    @property
    def endpoint(self) -> str:
        return f"{self.dev.host}:{self.port}"

    def install(self) -> None:
        """Resolve the broker's jars from Maven Central once; later calls are free."""
        done = self.lib / ".complete"
        if done.exists():
            return
        require_tool("java", ["openjdk-17-jre-headless"])
        mvn = require_tool("mvn", ["maven"])
        self.lib.parent.mkdir(parents=True, exist_ok=True)
        pom = self.lib.parent / "pom.xml"
        pom.write_text(
            resources.files("es_agents.dev")
            .joinpath("assets/kafka-pom.xml")
            .read_text()
            .replace("<kafka.version>4.4.0<", f"<kafka.version>{KAFKA_VERSION}<")
        )
        tmp = self.lib.with_suffix(".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        run(
            [
                mvn,
                "-q",
                "-B",
                "-f",
                str(pom),
                "dependency:copy-dependencies",
                "-DincludeScope=runtime",
                f"-DoutputDirectory={tmp}",
            ],
            f"resolving Kafka {KAFKA_VERSION} jars with Maven",
        )
        tmp.rename(self.lib)
        done.write_text(KAFKA_VERSION + "\n")

    def _properties(self) -> Path:
        d = self.dev
        voters = ",".join(
            f"{n}@{d.host}:{d.kafka_ports(n)[1]}" for n in range(1, d.brokers + 1)
        )
        replicas, min_isr = (str(v) for v in d.replication)
        props = {
            "process.roles": "broker,controller",
            "node.id": str(self.node),
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://{d.host}:{self.port},"
            f"CONTROLLER://{d.host}:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{d.host}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": (
                "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
            ),
            "log.dirs": str(self.data),
            "num.partitions": "1",
            "auto.create.topics.enable": "false",
            "offsets.topic.replication.factor": replicas,
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": min_isr,
            "transaction.state.log.num.partitions": "1",
            "share.coordinator.state.topic.replication.factor": replicas,
            "share.coordinator.state.topic.min.isr": min_isr,
            "default.replication.factor": replicas,
            "min.insync.replicas": min_isr,
            "group.initial.rebalance.delay.ms": "0",
            "log.cleaner.backoff.ms": "1000",
            # The log is the system of record: topics created by anyone keep every
            # record (es-agents also sets this on the topics it creates).
            "log.retention.ms": "-1",
            "log.retention.bytes": "-1",
            # Committed offsets of a group with no member are kept ~1,000 years
            # (Kafka's default: 7 days), so workers down for a week do not read
            # the commands topic again from its start.
            "offsets.retention.minutes": "525600000",
            # A cluster fences a silent broker after 4 s (Kafka's default: 9 s), so
            # its partitions get new leaders sooner, and drops a silent follower from
            # the in-sync replicas after 5 s (default 30 s), so acks=all writes and
            # the high watermark move on with the two brokers left. The controllers
            # elect a new active controller after 1 s without hearing from it
            # (Kafka's default: 2 s), and a vote lasts 0.5-1 s (default 1-2 s): a
            # new controller restarts every broker's session, so a dead controller's
            # partitions wait out the election and then the 4 s.
            **(
                {
                    "broker.session.timeout.ms": "4000",
                    "broker.heartbeat.interval.ms": "1000",
                    "replica.lag.time.max.ms": "5000",
                    "controller.quorum.fetch.timeout.ms": "1000",
                    "controller.quorum.election.timeout.ms": "500",
                }
                if self.cluster
                else {}
            ),
            **self.extra,
        }
        path = self.dir / "server.properties"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # passwords
        with os.fdopen(fd, "w") as out:
            out.write("".join(f"{k}={v}\n" for k, v in props.items()))
        return path

    def _java(self, main: str, *args: str) -> list[str]:
        log4j = self.dir / "log4j2.properties"
        log4j.write_text(
            resources.files("es_agents.dev")
            .joinpath("assets/log4j2.properties")
            .read_text()
        )
        return [
            "java",
            f"-Xms{self.dev.kafka_heap}",
            f"-Xmx{self.dev.kafka_heap}",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={log4j}",
            f"-Dkafka.logs.dir={self.dir}",
            "-cp",
            f"{self.lib}/*",
            main,
            *args,
        ]

    def start(self) -> bool:
        """Start the broker unless it runs; True if this call started it."""
        if self.proc.pid() is not None:
            self.wait_ready()
            return False
        require_free_port(self.dev.host, self.port, self.name)
        self.install()
        self.dir.mkdir(parents=True, exist_ok=True)
        props = self._properties()
        if not (self.data / "meta.properties").exists():
            cluster_id = self._cluster_id()
            run(
                self._java(
                    "kafka.tools.StorageTool",
                    "format",
                    f"--cluster-id={cluster_id}",
                    "-c",
                    str(props),
                    "--ignore-formatted",
                    *self.format_args,
                ),
                "kafka storage format",
            )
        self.proc.spawn(self._java("kafka.Kafka", str(props)))
        self.wait_ready()
        return True

    def _cluster_id(self) -> str:
        """A new id for a lone broker; the one the cluster's nodes share."""
        if not self.cluster:
            return new_cluster_id()
        shared = self.dir.parent / "cluster.id"
        if not shared.exists():  # DevStack writes it before starting the nodes
            raise Unavailable(f"{shared} is missing: start the cluster with dev up")
        return shared.read_text().strip()

    def answers(self) -> bool:
        try:
            with socket.create_connection((self.dev.host, self.port), timeout=0.5):
                pass
        except OSError:
            return False
        from confluent_kafka import KafkaException  # noqa: PLC0415
        from confluent_kafka.admin import AdminClient  # noqa: PLC0415

        try:
            AdminClient(self._admin).list_topics(timeout=2)
        except KafkaException:
            return False
        return True

    def wait_ready(self, timeout: float = 90.0) -> None:
        def ready() -> bool:
            if self.proc.pid() is None:
                raise Unavailable(f"kafka exited during start:\n{self.proc.log_tail()}")
            return self.answers()

        if not wait_for(ready, timeout, interval=0.2):
            raise Unavailable(
                f"kafka did not answer in {timeout}s:\n{self.proc.log_tail()}"
            )

    def kill(self, sig: signal.Signals = signal.SIGKILL) -> None:
        """Crash the broker (tests): the pid file stays, ``start`` restarts it."""
        pid = self.proc.pid()
        if pid is None:
            raise Unavailable("kafka is not running")
        self.proc.send_signal(sig)
        # A JVM's main thread shows as a zombie while its other threads still hold
        # the sockets: wait for the listener to go, too.
        host, port = self.dev.host, self.port
        if not wait_for(
            lambda: self.proc.pid() is None and not port_open(host, port), 30
        ):
            raise Unavailable(f"kafka (pid {pid}) did not die after {sig.name}")

    def stop(self) -> bool:
        return self.proc.stop(signal.SIGTERM, timeout=60)
