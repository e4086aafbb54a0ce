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
    def kafka_bootstrap(self) -> str:
        return f"{self.host}:{self.kafka_port}"

    @property
    def database_url(self) -> str:
        return f"postgresql://postgres@{self.host}:{self.postgres_port}/es_agents"

    @property
    def s3_endpoint(self) -> str:
        return f"http://{self.host}:{self.s3_port}"
