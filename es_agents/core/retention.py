"""An agent's retention policy: how long its finished runs stay projected.

A finished run's projection rows (events, snapshots, transcript chunks) are kept
``purge_after`` from its end; then the run is archived to the object store and its
rows purged (``es_agents.retention``). None keeps them for ever.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from es_agents.errors import ConfigError


@dataclass(frozen=True)
class Retention:
    """Finished runs archived and purged once they ended ``purge_after`` ago
    (None: kept for ever)."""

    purge_after: timedelta | None = None

    def __post_init__(self) -> None:
        if self.purge_after is not None and self.purge_after <= timedelta(0):
            raise ConfigError(f"purge_after must be positive: {self.purge_after}")


KEEP = Retention()
