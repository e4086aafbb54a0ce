"""The pure core: event and command types, run state and the fold.

Nothing under ``es_agents.core`` imports Kafka, Postgres, S3 or network code; a test
checks the import graph.
"""

from es_agents.core.commands import COMMAND_TYPES, Command
from es_agents.core.events import EVENT_TYPES, Event
from es_agents.core.fold import fold, replay
from es_agents.core.state import RunState, RunStatus

__all__ = [
    "COMMAND_TYPES",
    "EVENT_TYPES",
    "Command",
    "Event",
    "RunState",
    "RunStatus",
    "fold",
    "replay",
]
