"""es-agents: durable LLM-agent runs, event-sourced on Kafka, read side in Postgres.

The names below load lazily, so ``import es_agents.core`` stays free of Kafka,
Postgres, S3 and Avro code.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_LAZY = {
    "AvroCodec": "es_agents.codec",
    "SchemaCatalog": "es_agents.codec",
    "Command": "es_agents.core",
    "Event": "es_agents.core",
    "RunState": "es_agents.core",
    "fold": "es_agents.core",
    "replay": "es_agents.core",
    "ApprovalPolicy": "es_agents.core.approvals",
    "Budget": "es_agents.core.budget",
    "Limits": "es_agents.core.flow",
    "SigningKey": "es_agents.approvals",
    "Forbidden": "es_agents.errors",
    "AsyncClient": "es_agents.async_client",
    "Client": "es_agents.client",
    "CommandResult": "es_agents.client",
    "RunView": "es_agents.client",
    "RunRow": "es_agents.client",
    "PendingCall": "es_agents.client",
    "Reply": "es_agents.client",
    "EsAgentsError": "es_agents.errors",
    "NotFound": "es_agents.errors",
    "Unavailable": "es_agents.errors",
    "KafkaSettings": "es_agents.settings",
    "Settings": "es_agents.settings",
    "load_settings": "es_agents.settings",
    "serve": "es_agents.hosting",
    "Serving": "es_agents.hosting",
}

__all__ = [
    "ApprovalPolicy",
    "AsyncClient",
    "AvroCodec",
    "Budget",
    "Client",
    "Command",
    "CommandResult",
    "EsAgentsError",
    "Event",
    "Forbidden",
    "KafkaSettings",
    "Limits",
    "NotFound",
    "PendingCall",
    "Reply",
    "RunRow",
    "RunState",
    "RunView",
    "SchemaCatalog",
    "Serving",
    "Settings",
    "SigningKey",
    "Unavailable",
    "__version__",
    "fold",
    "load_settings",
    "replay",
    "serve",
]

if TYPE_CHECKING:
    from es_agents.approvals import SigningKey
    from es_agents.async_client import AsyncClient
    from es_agents.client import (
        Client,
        CommandResult,
        PendingCall,
        Reply,
        RunRow,
        RunView,
    )
    from es_agents.codec import AvroCodec, SchemaCatalog
    from es_agents.core import Command, Event, RunState, fold, replay
    from es_agents.core.approvals import ApprovalPolicy
    from es_agents.core.budget import Budget
    from es_agents.core.flow import Limits
    from es_agents.errors import EsAgentsError, Forbidden, NotFound, Unavailable
    from es_agents.hosting import Serving, serve
    from es_agents.settings import KafkaSettings, Settings, load_settings


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'es_agents' has no attribute {name!r}")
    return getattr(import_module(module), name)
