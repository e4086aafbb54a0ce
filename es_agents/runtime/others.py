"""Runs of other agents: each agent's workers apply only their agent's runs, and a
command for a run this worker has not loaded may belong to another agent's run
whose start it saw go by, or that the client recorded."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import final

from es_agents.core.commands import ForkRun, StartRun
from es_agents.ports import CommandBook

_STARTS = (StartRun.wire_name, ForkRun.wire_name)  # commands that create a run
BOUND = 100_000


@final
class OtherRuns:
    """Runs of other agents seen starting here (bounded, oldest out first)."""

    def __init__(self, book: CommandBook) -> None:
        self._book = book
        self._seen: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def remember(self, run_id: str, agent: str) -> None:
        with self._lock:
            remember(self._seen, run_id, agent)

    def __contains__(self, run_id: str) -> bool:
        with self._lock:
            return run_id in self._seen

    def agent_of(self, run_id: str) -> str | None:
        """The agent a run's start named, when this worker or the client saw it
        (blocking: may ask the command book)."""
        with self._lock:
            agent = self._seen.get(run_id)
        if agent is not None:
            return agent
        for verdict in self._book.for_run(run_id):
            if verdict.type in _STARTS and verdict.status != "refused":
                return verdict.agent
        return None


def remember(table: OrderedDict[str, str], run_id: str, value: str) -> None:
    table[run_id] = value
    table.move_to_end(run_id)
    while len(table) > BOUND:
        table.popitem(last=False)
