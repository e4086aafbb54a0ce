"""A worker's share of retention: every ``retention_every_seconds`` it archives and
purges its agent's runs that ended longer ago than the agent's policy keeps them,
and deletes payload objects no run claims once past their grace
(``es_agents.retention``), in a thread of its own so the object store's round trips
never hold up a step. Several workers of one agent may sweep at once: archiving
is idempotent (the same events make the same object) and a purge takes the run's
archive row under lock."""

from __future__ import annotations

import logging
import threading

from es_agents.core.retention import Retention
from es_agents.errors import EsAgentsError
from es_agents.ports import Ports
from es_agents.retention import Retainer
from es_agents.settings import Settings

log = logging.getLogger(__name__)


class RetentionSweep:
    def __init__(
        self, ports: Ports, settings: Settings, agent: str, retention: Retention
    ) -> None:
        self._retainer = Retainer(ports, settings)
        self._agent = agent
        self._retention = retention
        self._every = settings.retention_every_seconds
        # Orphaned payload objects are looked after even without a policy (runs
        # archived or forgotten by hand leave them).
        self._active = ports.archives is not None and ports.claims is not None
        self._last = 0.0
        self._thread: threading.Thread | None = None
        self.purged = 0  # runs purged by this worker

    def maybe(self, now: float) -> None:
        """Start a sweep when one is due and none runs."""
        if not self._active or now - self._last < self._every:
            return
        if self._thread is not None and self._thread.is_alive():
            return
        self._last = now
        self._thread = threading.Thread(
            target=self._sweep, daemon=True, name="es-retention"
        )
        self._thread.start()

    def _sweep(self) -> None:
        try:
            done = self._retainer.sweep(self._agent, self._retention)
        except EsAgentsError as e:
            log.warning("retention of %s: %s", self._agent, e)
            return
        self.purged += len(done)
        if done:
            log.info("retention: %d runs of %s archived and purged", len(done),
                     self._agent)  # fmt: skip

    def close(self, timeout: float = 30.0) -> None:
        if self._thread is not None:
            self._thread.join(timeout)
