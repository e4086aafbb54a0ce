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

    home: Path = Field(default_factory=lambda: Path.home() / ".es-agents" / "dev")
    host: str = "127.0.0.1"
    kafka_port: int = 19092
    kafka_controller_port: int = 19093
    kafka_heap: str = "512m"
    # Brokers of the local cluster (``dev up --brokers 3``); unset: what the stack's
    # home says it was made with, else 1. Node i listens on kafka_port + 100*(i-1).
    kafka_brokers: int | None = Field(default=None, ge=1, le=9)
    postgres_port: int = 55432
    postgres_fsync: bool = True
    s3_port: int = 19000
    s3_access_key: str = "es-agents"
    s3_secret_key: str = "es-agents-secret"  # noqa: S105 - a local dev stack
    s3_bucket: str = "es-payloads"

    @property
    def root(self) -> Path:
        return self.home.resolve()

    @property
    def brokers(self) -> int:
        if self.kafka_brokers is not None:
            return self.kafka_brokers
        recorded = self.root / "kafka" / "brokers"
        return int(recorded.read_text()) if recorded.exists() else 1

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
