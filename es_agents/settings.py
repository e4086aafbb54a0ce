"""Settings from ``ES_AGENTS_*`` environment variables or flags, validated early."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import (
    BaseModel,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from es_agents.errors import ConfigError

# A topic prefix belongs to one store (its runs, offsets and projections): the
# Postgres store's default differs from Kafka's so that both run on one database.
KAFKA_PREFIX = "es"
POSTGRES_PREFIX = "es-pg"

_PREFIX_CHARS = frozenset(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"
)


class KafkaSettings(BaseSettings):
    """Where the log lives and how to reach it; the one place with librdkafka's keys."""

    model_config = SettingsConfigDict(env_prefix="ES_AGENTS_", extra="ignore")

    bootstrap_servers: str = Field(
        default="127.0.0.1:19092",
        description="The brokers to reach first: host:port, comma-separated",
    )
    topic_prefix: str = Field(
        default=KAFKA_PREFIX,
        description=f"Names the topics and owns their runs (default {KAFKA_PREFIX!r}; "
        f"{POSTGRES_PREFIX!r} on the Postgres store)",
    )
    partitions: int = Field(
        default=6,
        ge=1,
        le=10_000,
        description="Partitions of the topics this creates; recorded with the "
        "prefix and fixed from then on (a run stays on one partition)",
    )
    replication_factor: int = Field(
        default=1, ge=1, description="Replicas of the topics this creates"
    )
    min_insync_replicas: int = Field(
        default=1, ge=1, description="Topics' min.insync.replicas (with acks=all)"
    )
    topic_config: dict[str, str] = Field(
        default_factory=dict,
        description="More configs for the topics this creates: JSON like "
        '{"flush.messages": "1"} (the broker fsyncs every message before it '
        "acknowledges)",
    )
    linger_ms: float = Field(
        default=0.0, ge=0, description="0 = send each append at once"
    )
    batch_linger_ms: float = Field(
        default=0.5,
        ge=0,
        description="How long the producer of batches of several runs' steps waits "
        "for more before it sends (a lone run's step goes at once); 0 = one producer "
        "for all, sending at once",
    )
    delivery_timeout_ms: int = Field(
        default=30_000,
        ge=1_000,
        description="How long the producer tries to deliver an append before it "
        "reports a failure",
    )
    session_timeout_ms: int = Field(
        default=45_000,
        ge=6_000,
        description="How long a silent group member keeps its partitions",
    )
    max_event_bytes: int = Field(
        default=900_000,
        ge=1_000,
        description="Largest event body; keep below the broker's message.max.bytes",
    )
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = (
        Field(default="PLAINTEXT", description="librdkafka's security.protocol")
    )
    sasl_mechanism: (
        Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"] | None
    ) = Field(default=None, description="librdkafka's sasl.mechanism")
    sasl_username: str | None = Field(default=None, description="sasl.username")
    sasl_password: SecretStr | None = Field(default=None, description="sasl.password")
    ssl_ca_location: str | None = Field(
        default=None, description="ssl.ca.location: the CA certificate (PEM)"
    )
    ssl_certificate_location: str | None = Field(
        default=None, description="ssl.certificate.location: the client's certificate"
    )
    ssl_key_location: str | None = Field(
        default=None, description="ssl.key.location: the client's private key"
    )
    schema_registry_url: str | None = Field(
        default=None,
        description="A Confluent Schema Registry: records are framed with its schema "
        "ids (unset: Avro single-object encoding, the fingerprint on the wire)",
    )

    @field_validator("topic_prefix")
    @classmethod
    def _valid_prefix(cls, value: str) -> str:
        if not value or not set(value) <= _PREFIX_CHARS or len(value) > 200:
            raise ValueError("topic prefix must be 1-200 chars of [a-zA-Z0-9._-]")
        return value

    @property
    def commands_topic(self) -> str:
        return f"{self.topic_prefix}.commands"

    @property
    def events_topic(self) -> str:
        return f"{self.topic_prefix}.events"

    @property
    def dlq_topic(self) -> str:
        return f"{self.topic_prefix}.dlq"

    @property
    def stream_topic(self) -> str:
        """Model answers while they stream (``ports.Delta``): not part of the log,
        kept an hour."""
        return f"{self.topic_prefix}.stream"

    @property
    def topics(self) -> list[str]:
        """The prefix's topics: commands, events and the dead letters."""
        return [self.commands_topic, self.events_topic, self.dlq_topic]

    def to_librdkafka(self) -> dict[str, str | int | float]:
        """Connection and security settings shared by producers, consumers and admin."""
        conf: dict[str, str | int | float] = {
            "bootstrap.servers": self.bootstrap_servers,
            "security.protocol": self.security_protocol,
            # Reconnect within a second of a broker restart (default backs off to 10s).
            "reconnect.backoff.max.ms": 1000,
            # librdkafka drops its bootstrap connection once metadata names the
            # brokers, then holds the next connection back for half this backoff:
            # 50 ms of every new client's first request at the default of 100.
            "reconnect.backoff.ms": 10,
            # One small record per step: send it now rather than wait for more bytes.
            "socket.nagle.disable": True,
            # A partition whose leader died is looked up again with these backoffs
            # until the metadata names its new leader (defaults 100 ms growing to
            # 1 s): on a three-broker cluster the first write after a leader's
            # SIGKILL came back 4.1-4.5 s after it rather than 5.0-7.8 s.
            "retry.backoff.ms": 50,
            "retry.backoff.max.ms": 250,
        }
        if self.sasl_mechanism is not None:
            conf["sasl.mechanism"] = self.sasl_mechanism
        if self.sasl_username is not None:
            conf["sasl.username"] = self.sasl_username
        if self.sasl_password is not None:
            conf["sasl.password"] = self.sasl_password.get_secret_value()
        for key, value in (
            ("ssl.ca.location", self.ssl_ca_location),
            ("ssl.certificate.location", self.ssl_certificate_location),
            ("ssl.key.location", self.ssl_key_location),
        ):
            if value is not None:
                conf[key] = value
        return conf

    def producer_config(self) -> dict[str, str | int | float]:
        return {
            **self.to_librdkafka(),
            # Idempotence implies acks=all, retries, and at most 5 in flight with order
            # kept: a later record of a partition is never durable without the earlier.
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": self.linger_ms,
            "message.timeout.ms": self.delivery_timeout_ms,
            # Java-compatible key hashing, so commands and events of a run share a
            # partition number and Java/Kafka-Streams readers agree.
            "partitioner": "murmur2_random",
            "compression.type": "none",
        }

    def consumer_config(self, group_id: str) -> dict[str, str | int | float | bool]:
        return {
            **self.to_librdkafka(),
            "group.id": group_id,
            "enable.auto.commit": False,
            # Offsets are stored by the source once a message was handed out or
            # dead-lettered, and committed only when the caller says so.
            "enable.auto.offset.store": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "partition.assignment.strategy": "cooperative-sticky",
            "session.timeout.ms": self.session_timeout_ms,
            # A member learns of a rebalance at its next heartbeat: a sixth of the
            # session (librdkafka's 3 s at most), so the partitions of a member
            # that died move within about a session's time, not a session and 3 s.
            "heartbeat.interval.ms": min(3000, self.session_timeout_ms // 6),
        }


class ModelSettings(BaseSettings):
    """A real model's endpoint (``ES_AGENTS_MODEL_*``) for agents built from it."""

    model_config = SettingsConfigDict(env_prefix="ES_AGENTS_MODEL_", extra="ignore")

    provider: Literal["openai", "anthropic"] = Field(
        default="openai",
        description="openai: Chat Completions (any compatible server); anthropic: "
        "the Messages API",
    )
    base_url: str | None = Field(
        default=None,
        description="An OpenAI-compatible server (vLLM, Ollama, llama.cpp, LiteLLM); "
        "unset: the provider's own API",
    )
    name: str = Field(default="gpt-4o-mini", description="The model to ask for")
    api_key: SecretStr | None = Field(
        default=None, description="The endpoint's key, when it wants one"
    )
    timeout: float = Field(
        default=120.0, gt=0, description="Seconds one model call may take"
    )
    max_tokens: int = Field(default=4096, ge=1, description="Anthropic's max_tokens")


class ModelPrice(BaseModel):
    """What a model costs, in USD per million tokens."""

    input: float = Field(ge=0)
    output: float = Field(ge=0)

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.input + completion_tokens * self.output) / 1e6


class ModelRateLimit(BaseModel):
    """A model's limits over all workers of the topic prefix, per minute."""

    requests_per_minute: int | None = Field(default=None, ge=1)
    tokens_per_minute: int | None = Field(default=None, ge=1)


class Settings(BaseSettings):
    """Everything a worker, projector or CLI command needs."""

    model_config = SettingsConfigDict(env_prefix="ES_AGENTS_", extra="ignore")

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    database_url: SecretStr = Field(
        default=SecretStr("postgresql://postgres@127.0.0.1:55432/es_agents"),
        description="The read side (and the whole log on the Postgres store)",
    )
    s3_endpoint: str = Field(
        default="http://127.0.0.1:19000",
        description="The S3-compatible store of large payloads",
    )
    s3_bucket: str = Field(default="es-payloads", description="The payloads' bucket")
    s3_access_key: str = Field(
        default="es-agents", description="The store's access key"
    )
    s3_secret_key: SecretStr = Field(
        default=SecretStr("es-agents-secret"), description="The store's secret key"
    )
    payloads: Literal["s3", "off"] = Field(
        default="s3",
        description="s3: payload fields over the threshold go to the object store",
    )
    payload_threshold: int = Field(
        default=256 * 1024,
        ge=1024,
        description="Bytes above which a payload field is claim-checked",
    )
    store: Literal["kafka", "postgres", "memory"] = Field(
        default="kafka",
        description="Where the log lives: kafka, postgres (no broker), memory (tests)",
    )
    fencing: Literal["epochs", "transactions", "none"] = Field(
        default="epochs",
        description="epochs (claims and epochs in the log) or transactions (one Kafka "
        "transaction per append): a worker that lost a partition cannot have an "
        "append counted; none: a single writer per partition is trusted",
    )
    snapshot_every: int = Field(
        default=100, ge=1, description="K: snapshot every K events"
    )
    tool_calls_per_run: int = Field(
        default=16,
        ge=1,
        description="A model answer's tool calls run concurrently, at most this many "
        "of one run at a time",
    )
    tool_calls_per_worker: int = Field(
        default=64,
        ge=1,
        description="Tool and model calls a worker makes at once, over all its runs "
        "(plain functions each take a thread of the call pool meanwhile)",
    )
    max_active: int | None = Field(
        default=None,
        ge=1,
        description="At most this many of the agent's runs take steps at once; the "
        "others wait in a queue (replaces the agent's limits.max_active)",
    )
    max_active_per_tenant: int | None = Field(
        default=None,
        ge=1,
        description="At most this many runs of one tenant take steps at once "
        "(replaces the agent's limits.max_active_per_tenant)",
    )
    purge_after_days: float | None = Field(
        default=None,
        gt=0,
        description="Finished runs are archived to the object store and their "
        "projection rows purged this many days after they ended (replaces the "
        "agent's retention.purge_after; unset: as the agent says, by default kept)",
    )
    payload_delete_grace_hours: float = Field(
        default=24.0,
        ge=0,
        description="A payload object no run claims any more is deleted with its "
        "run's purge only if written longer ago than this (a run still going may "
        "have just stored the same bytes, before its claim reached the projection)",
    )
    retention_every_seconds: float = Field(
        default=60.0,
        gt=0,
        description="How often a worker looks for finished runs due to be archived",
    )
    tenant_limits: dict[str, int] = Field(
        default_factory=dict,
        description="Named tenants' own limits of active runs, as JSON "
        '(\'{"acme": 20, "trial": 2}\'); a tenant not named here has '
        "max_active_per_tenant (added to the agent's limits.tenants, replacing "
        "the same names)",
    )
    warm_runs: int = Field(
        default=128,
        ge=0,
        description="A worker keeps the loaded state of this many runs that last "
        "paused in it: their next command skips the load while the worker still "
        "owns their partition (0: every activation loads)",
    )
    model_rate_limits: dict[str, ModelRateLimit] = Field(
        default_factory=dict,
        description='Per model id, its limits over all workers: JSON like {"gpt-4o": '
        '{"requests_per_minute": 500, "tokens_per_minute": 30000}}; a call waits for '
        "its turn (and every worker waits out a 429's Retry-After) without spending "
        "the run's retries",
    )
    prices: dict[str, ModelPrice] = Field(
        default_factory=dict,
        description='Per model id, USD per million tokens: JSON like {"gpt-4o": '
        '{"input": 2.5, "output": 10}} (replay and audit price model calls)',
    )
    metrics_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="Workers and the projector serve Prometheus metrics on "
        "ES_AGENTS_METRICS_ADDR:PORT/metrics (0: any free port, logged)",
    )
    metrics_addr: str = Field(
        default="127.0.0.1", description="The address /metrics is served on"
    )
    tracing: Literal["off", "otlp"] = Field(
        default="off",
        description="otlp: OpenTelemetry spans of runs and steps, exported by OTLP "
        "over HTTP to OTEL_EXPORTER_OTLP_ENDPOINT (the standard OTEL_* variables)",
    )
    connect_timeout: float = Field(
        default=5.0,
        gt=0,
        description="Seconds a command or client waits for Kafka or Postgres to "
        "answer before it says which one is unreachable",
    )
    projector_group: str | None = Field(
        default=None, description="The projector's consumer group (PREFIX.projector)"
    )
    projector_gather_ms: int = Field(
        default=20,
        ge=0,
        le=1000,
        description="The projector's reads wait up to this long for 64 KiB of "
        "events to gather: under load the broker serves fewer, larger fetches; "
        "at rest the projection trails the log by at most this (0: every record "
        "at once)",
    )
    master_key: SecretStr | None = Field(
        default=None,
        description="Base64 of 32 bytes: wraps the data keys of runs whose agent "
        "encrypts its payloads (es-agents vault new-master-key makes one)",
    )
    master_key_file: str | None = Field(
        default=None, description="A file holding the master key (base64)"
    )
    writer_key: SecretStr | None = Field(
        default=None,
        description="Base64 of 32 bytes: the key workers sign the events they append "
        "with, and every reader verifies them with (default: kept in Postgres, "
        "table writer_keys, made by the first worker)",
    )
    ack_journal: Path | None = Field(
        default=None,
        description="Append run_id/seq/event_id of every acknowledged event here "
        "(bench chaos checks it against the log)",
    )

    @model_validator(mode="after")
    def _store_default_prefix(self) -> Settings:
        """The Postgres store's records live under ``es-pg`` unless a prefix is set:
        a prefix is recorded with its store, and one database serves both stores
        side by side with the defaults."""
        if (
            self.store == "postgres"
            and "topic_prefix" not in self.kafka.model_fields_set
        ):
            self.kafka = self.kafka.model_copy(update={"topic_prefix": POSTGRES_PREFIX})
        return self

    @property
    def master(self) -> bytes | None:
        """The master key's 32 bytes, if one is configured."""
        from es_agents.vault import load_master_key  # noqa: PLC0415

        value = self.master_key.get_secret_value() if self.master_key else None
        return load_master_key(value, self.master_key_file)

    @property
    def projector_group_id(self) -> str:
        return self.projector_group or f"{self.kafka.topic_prefix}.projector"


def load_settings(**overrides: object) -> Settings:
    """Settings from the environment, flags on top; bad values are a ConfigError."""
    try:
        kafka_fields = {
            k: v for k, v in overrides.items() if k in KafkaSettings.model_fields
        }
        rest = {k: v for k, v in overrides.items() if k not in kafka_fields}
        return Settings(kafka=KafkaSettings(**kafka_fields), **rest)  # type: ignore[arg-type]
    except ValidationError as e:
        raise ConfigError(f"invalid settings: {e}") from e
