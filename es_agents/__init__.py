"""es-agents: durable LLM-agent runs, event-sourced on Kafka, read side in Postgres."""

from es_agents.codec import AvroCodec, SchemaCatalog
from es_agents.core import (
    COMMAND_TYPES,
    EVENT_TYPES,
    Command,
    Event,
    RunState,
    fold,
    replay,
)
from es_agents.errors import EsAgentsError
from es_agents.settings import KafkaSettings, Settings, load_settings

__version__ = "0.1.0"

__all__ = [
    "COMMAND_TYPES",
    "EVENT_TYPES",
    "AvroCodec",
    "Command",
    "EsAgentsError",
    "Event",
    "KafkaSettings",
    "RunState",
    "SchemaCatalog",
    "Settings",
    "__version__",
    "fold",
    "load_settings",
    "replay",
]
