"""The version gate's events: what a run's log records when the gate decides.

Pure: given the run's state and the running code's versions, the events to append
(as types and fields, added by the run loop so they fold in order). A refusal pauses
a running run (``interrupted`` with reason ``version_mismatch``) and leaves a blocked
one as it is; a migration or an allowed change is recorded as ``migrated`` (with the
migration's ``state_patched`` events); nothing changed records nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from es_agents.core.events import Event, Interrupted, Migrated, Resumed, StatePatched
from es_agents.core.state import RunState, Versions
from es_agents.core.step import canonical_json
from es_agents.core.versions import (
    Migrate,
    Refuse,
    StateMigration,
    VersionPolicy,
    fingerprint,
    gate,
)

Planned = tuple[type[Event], dict[str, object]]


@dataclass(frozen=True)
class GateEvents:
    events: list[Planned]
    refused: bool  # the run stops here: make the pause durable at once


def gate_events(
    state: RunState,
    running: Versions,
    policy: VersionPolicy,
    migrations: Sequence[StateMigration],
) -> GateEvents:
    decision = gate(state.versions, running, policy, migrations)
    blocked = state.status == "blocked"
    changed = {k: list(v) for k, v in decision.changed.items()}
    if isinstance(decision, Refuse):
        if blocked:  # a blocked run stays as it is: nothing keeps retrying
            return GateEvents([], refused=True)
        detail = {
            "decision": "refuse",
            "reason": decision.reason,
            "started": fingerprint(state.versions),
            "running": fingerprint(running),
            "changed": changed,
        }
        return GateEvents(
            [
                (
                    Interrupted,
                    {
                        "reason": "version_mismatch",
                        "detail_json": canonical_json(detail),
                    },
                )
            ],
            refused=True,
        )
    if not decision.changed and not blocked:
        return GateEvents([], refused=False)  # the same code: nothing to record
    events: list[Planned] = []
    if blocked:
        events.append((Resumed, {"reason": "version_ok", "by": running.agent_version}))
    migration = decision.migration if isinstance(decision, Migrate) else None
    changes = {
        "decision": "verbatim" if migration is None else "migrate",
        "migration": None if migration is None else migration.description,
        "changed": changed,
        "versions": fingerprint(running),
    }
    events.append(
        (
            Migrated,
            {
                "from_version": state.versions.agent_version,
                "to_version": running.agent_version,
                "changes_json": canonical_json(changes),
            },
        )
    )
    if isinstance(decision, Migrate):
        for key, value in decision.migration.patch(state).items():
            events.append(
                (StatePatched, {"key": key, "value_json": canonical_json(value)})
            )
    return GateEvents(events, refused=False)
