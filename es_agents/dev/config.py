"""Where the local stack lives and which ports it listens on (``ES_AGENTS_DEV_*``).

The stack has one home whatever the current directory: ``ES_AGENTS_DEV_HOME``, else
``~/.es-agents/dev``; ``dev up``, ``dev status`` and ``dev down`` find it from
anywhere."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

KAFKA_VERSION = "4.4.0"
S3PROXY_VERSION = "4.0.0"


class DevSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ES_AGENTS_DEV_", extra="ignore")

    home: Path = Field(
        default_factory=lambda: Path.home() / ".es-agents" / "dev",
        description="Where the local stack keeps its jars, data, logs and pids",
    )
    host: str = Field(default="127.0.0.1", description="The address it listens on")
    kafka_port: int = Field(default=19092, description="The broker's client port")
    kafka_controller_port: int = Field(
        default=19093, description="The KRaft controller's port"
    )
    kafka_heap: str = Field(default="512m", description="The broker's JVM heap")
    kafka_brokers: int | None = Field(
        default=None,
        ge=1,
        le=9,
        description="Brokers of the local cluster (dev up --brokers 3); unset: what "
        "the stack's home was made with, else 1. Node i listens on "
        "kafka_port + 100*(i-1)",
    )
    kafka_acls: bool | None = Field(
        default=None,
        description="Kafka with SASL/SCRAM users and ACLs (dev up --acls); unset: "
        "what the stack's home was made with, else off. Its records live in "
        "HOME/kafka-acls, apart from the open broker's",
    )
    postgres_port: int = Field(default=55432, description="Postgres' port")
    postgres_fsync: bool = Field(
        default=True, description="Postgres' fsync (on, as in production)"
    )
    s3_port: int = Field(default=19000, description="S3Proxy's port")
    s3_access_key: str = Field(default="es-agents", description="S3Proxy's access key")
    s3_secret_key: str = Field(
        default="es-agents-secret",  # a local dev stack
        description="S3Proxy's secret key",
    )
    s3_bucket: str = Field(default="es-payloads", description="The bucket it makes")

    @property
    def root(self) -> Path:
        return self.home.resolve()

    @property
    def brokers(self) -> int:
        if self.kafka_brokers is not None:
            return self.kafka_brokers
        recorded = self.root / "kafka" / "brokers"
        return int(recorded.read_text()) if recorded.exists() else 1

    @property
    def acls(self) -> bool:
        if self.kafka_acls is not None:
            return self.kafka_acls
        recorded = self.root / "kafka" / "acls"
        return recorded.exists() and recorded.read_text().strip() == "on"

    @property
    def kafka_home(self) -> Path:
        """Where the brokers keep their data: the secured ones apart."""
        return self.root / ("kafka-acls" if self.acls else "kafka")

    def kafka_ports(self, node: int) -> tuple[int, int]:
        """(client port, controller port) of broker ``node`` (1-based)."""
        step = 100 * (node - 1)
        return self.kafka_port + step, self.kafka_controller_port + step

    @property
    def kafka_bootstrap(self) -> str:
        return ",".join(
            f"{self.host}:{self.kafka_ports(n)[0]}" for n in range(1, self.brokers + 1)
        )

    @property
    def replication(self) -> tuple[int, int]:
        """(replication factor, min.insync.replicas) for this many brokers."""
        n = self.brokers
        return min(n, 3), 2 if n >= 3 else 1

    @property
    def database_url(self) -> str:
        return f"postgresql://postgres@{self.host}:{self.postgres_port}/es_agents"

    @property
    def s3_endpoint(self) -> str:
        return f"http://{self.host}:{self.s3_port}"
