"""What one run's loop may touch: the ports, the running code's versions, its
partition's driver, and the pools its blocking calls run on -- never the worker.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol

from es_agents.agent import declared_gates, running_versions
from es_agents.approvals import Approvals, policies_of
from es_agents.core.commands import Command
from es_agents.core.events import Event
from es_agents.core.flow import NO_LIMITS, InvalidLimits, Limits
from es_agents.core.rates import ModelRate
from es_agents.core.retention import KEEP, Retention
from es_agents.core.state import RunState, Versions
from es_agents.core.versions import StateMigration, VersionPolicy
from es_agents.dead_letters import DeadLetterQueue
from es_agents.errors import ConfigError
from es_agents.observability import NoTelemetry, NoTracer, Telemetry, Tracer
from es_agents.payloads import ClaimCheck
from es_agents.ports import (
    CommandBook,
    Deltas,
    EffectLedger,
    EventLog,
    Flow,
    ModelRates,
    Ports,
    Probe,
    Timers,
)
from es_agents.redaction import Redactor, has_secrets
from es_agents.runtime.driver import PartitionDriver
from es_agents.runtime.loader import RunLoader
from es_agents.runtime.pools import Blocking, Calls
from es_agents.runtime.sealed_ledger import SealedLedger
from es_agents.settings import ModelPrice, Settings
from es_agents.vault import Cipher, encrypts


class NotMine(Exception):
    """A command for a run of another agent: that agent's workers apply it."""


class Owned(Protocol):
    """What a loop needs to know of its partition's ownership."""

    def epoch(self, partition: int) -> int:
        """The owner's fencing token; raise ``FencedError`` when not owned."""
        ...

    def current_epoch(self, partition: int) -> int | None: ...

    def driver(self, partition: int) -> PartitionDriver: ...

    def committed_end(self, partition: int) -> int: ...


@dataclass
class RunActor:
    """A run this worker drives: its inbox of commands (filled by the poll loop)
    and whether a task drives it now."""

    run_id: str
    partition: int
    inbox: deque[tuple[Command, int]] = field(default_factory=deque)
    active: bool = False
    wake: bool = False
    stopping: bool = False


@dataclass
class RunContext:
    """Everything a run's loop may touch."""

    agent: Any  # es_agents.agent.Agent (a Protocol of plan/tools/model/name)
    running: Versions
    policy: VersionPolicy
    migrations: list[StateMigration]
    gates: frozenset[str] | None
    log: EventLog
    loader: RunLoader
    owned: Owned
    book: CommandBook
    ledger: EffectLedger
    timers: Timers
    dlq: DeadLetterQueue
    claims: ClaimCheck | None
    probe: Probe
    commands_topic: str
    max_event_bytes: int
    tool_calls_per_run: int
    done: Callable[[int, int], None]  # (partition, offset) applied
    start_agent: Callable[[str], str | None]
    io: Blocking = field(default_factory=Blocking)  # the ports' blocking calls
    calls: Calls = field(default_factory=Calls)  # sync tools and model clients
    lock: threading.Lock = field(default_factory=threading.Lock)  # the inboxes
    append_ms: deque[float] = field(default_factory=lambda: deque(maxlen=100_000))
    telemetry: Telemetry = field(default_factory=NoTelemetry)
    tracer: Tracer = field(default_factory=NoTracer)
    approvals: Approvals | None = None  # the agent's gates with a policy
    cipher: Cipher | None = None  # reveals encrypted payloads (and writes them)
    encrypt: bool = False  # the agent's payloads are written encrypted
    redactor: Redactor | None = None  # seals secret fields into tokens
    # Gates whose deadline hands them to other deciders, and for how long.
    escalations: dict[str, timedelta] = field(default_factory=dict)
    # Where a model's answer streams while the call is in flight (None: it does not:
    # the store has no stream, the agent says stream=False, or it encrypts).
    deltas: Deltas | None = None
    # USD per million tokens per model id (ES_AGENTS_PRICES): a run's cost so far.
    prices: Mapping[str, ModelPrice] = field(default_factory=dict)
    # How many of the agent's runs may take steps at once (core.flow), and the
    # places and queue that hold them to it (None: no limits).
    limits: Limits = NO_LIMITS
    flow: Flow | None = None
    # Per model id, its limits over the cluster's workers (ES_AGENTS_MODEL_RATE_
    # LIMITS), and the counts that hold them (core.rates); a 429's Retry-After is
    # kept there too, for every worker.
    rate_limits: Mapping[str, ModelRate] = field(default_factory=dict)
    rates: ModelRates | None = None

    def cost(self, state: RunState) -> float | None:
        """What the run's model calls cost so far (None: its model has no price)."""
        price = self.prices.get(state.versions.model_id)
        if price is None:
            return None
        return price.cost(state.prompt_tokens, state.completion_tokens)


class Stepping(Protocol):
    """What a step (``effects``, ``model_steps``) needs of its run's loop."""

    ctx: RunContext
    agent: Any
    actor: RunActor
    epoch: int
    state: RunState | None

    def add(self, event_type: type[Event], **fields: object) -> Event: ...

    async def flush(self) -> None: ...


def run_context(
    agent: Any,
    ports: Ports,
    settings: Settings,
    *,
    owned: Owned,
    loader: RunLoader,
    dlq: DeadLetterQueue,
    done: Callable[[int, int], None],
    start_agent: Callable[[str], str | None],
    calls: Calls,
) -> RunContext:
    """The context of ``agent``'s runs: what the running code is (the version gate
    compares it with what each run started under), its gates and approval
    policies, how its payloads and secrets are kept, and the ports."""
    running = running_versions(agent)
    policies = policies_of(agent)
    escalations = dict(getattr(agent, "escalations", {}))
    cipher = Cipher(ports.vault)
    encrypt = encrypts(agent)
    if (
        (encrypt or has_secrets(agent))
        and ports.store != "memory"
        and (settings.master is None)
    ):
        what = "encrypts its payloads" if encrypt else "has secret arguments"
        raise ConfigError(
            f"agent {agent.name!r} {what}: set ES_AGENTS_MASTER_KEY "
            "or ES_AGENTS_MASTER_KEY_FILE (es-agents vault new-master-key)"
        )
    limits = limits_of(agent, settings)
    if limits.limited and ports.flow is None:
        raise ConfigError(f"the {ports.store} store keeps no places for flow control")
    kafka = settings.kafka
    return RunContext(
        agent=agent,
        running=running,
        policy=getattr(agent, "version_policy", VersionPolicy()),
        migrations=list(getattr(agent, "migrations", [])),
        gates=declared_gates(agent),
        log=ports.log,
        loader=loader,
        owned=owned,
        book=ports.book,
        ledger=SealedLedger(ports.ledger, cipher) if encrypt else ports.ledger,
        timers=ports.timers,
        dlq=dlq,
        claims=ports.claims,
        probe=ports.probe,
        commands_topic=kafka.commands_topic,
        max_event_bytes=kafka.max_event_bytes,
        tool_calls_per_run=settings.tool_calls_per_run,
        done=done,
        start_agent=start_agent,
        calls=calls,
        telemetry=ports.telemetry,
        tracer=ports.tracer,
        approvals=(
            Approvals(
                policies,
                ports.keyring,
                escalations={g: p for g, (p, _) in escalations.items()},
            )
            if policies or escalations
            else None
        ),
        escalations={g: within for g, (_, within) in escalations.items()},
        cipher=cipher,
        encrypt=encrypt,
        redactor=Redactor(cipher, agent.tools),
        # Encrypted agents do not stream: deltas would be their answers in clear.
        deltas=None if encrypt or not getattr(agent, "stream", True) else ports.deltas,
        prices=settings.prices,
        limits=limits,
        flow=ports.flow if limits.limited else None,
        rate_limits={
            model_id: ModelRate(r.requests_per_minute, r.tokens_per_minute)
            for model_id, r in settings.model_rate_limits.items()
        },
        rates=ports.rates,
    )


def retention_of(agent: Any, settings: Settings) -> Retention:
    """The agent's retention policy, ``ES_AGENTS_PURGE_AFTER_DAYS`` replacing it."""
    if settings.purge_after_days is not None:
        return Retention(timedelta(days=settings.purge_after_days))
    own: Retention = getattr(agent, "retention", KEEP)
    return own


def limits_of(agent: Any, settings: Settings) -> Limits:
    """The agent's limits of active runs, each one replaced by its setting when
    that is given (``ES_AGENTS_MAX_ACTIVE``, ``ES_AGENTS_MAX_ACTIVE_PER_TENANT``,
    and ``ES_AGENTS_TENANT_LIMITS`` for the tenants it names)."""
    own: Limits = getattr(agent, "limits", NO_LIMITS)
    try:
        return Limits(
            max_active=settings.max_active or own.max_active,
            max_active_per_tenant=(
                settings.max_active_per_tenant or own.max_active_per_tenant
            ),
            tenants={**own.tenants, **settings.tenant_limits},
        )
    except InvalidLimits as e:
        raise ConfigError(f"agent {agent.name!r}: {e}") from e
