"""The version gate: may a run continue under the code that is running now?

``run_started`` records what a run started under (agent version, code revision,
prompt hash, model id, tool-schema hash, reducer version). On every resume the gate
compares that with the running code and decides: continue verbatim (nothing changed,
or only what the policy allows), migrate (a migration is registered for the agent
version's from -> to), or refuse (the run is blocked, nothing is lost, and a worker
with the right code or a new migration continues it). Decisions that are not a plain
"nothing changed" are appended to the log.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Literal

from pydantic import JsonValue

from es_agents.core.state import RunState, Versions

Rule = Literal["allow", "refuse"]
FINGERPRINT_FIELDS = (
    "agent_version",
    "code_revision",
    "prompt_hash",
    "model_id",
    "tools_hash",
    "reducer_version",
)


@dataclass(frozen=True)
class VersionPolicy:
    """Per fingerprint field: may a run continue when it changed? Defaults: the agent's
    declared version, its tool schemas and the reducer must match (or be migrated);
    a new prompt, model or code revision is allowed and recorded."""

    agent_version: Rule = "refuse"
    code_revision: Rule = "allow"
    prompt_hash: Rule = "allow"
    model_id: Rule = "allow"
    tools_hash: Rule = "refuse"
    reducer_version: Rule = "refuse"

    def rule(self, name: str) -> Rule:
        value: Rule = getattr(self, name)
        return value


@dataclass(frozen=True)
class StateMigration:
    """Moves runs from one agent version to another. ``patch`` is pure: it returns
    the state keys to set, which are appended as ``state_patched`` events so the fold
    of the log reproduces the migrated state."""

    from_version: str
    to_version: str
    description: str
    patch: Callable[[RunState], Mapping[str, JsonValue]] = field(
        default=lambda _state: {}
    )


@dataclass(frozen=True)
class Verbatim:
    changed: dict[str, tuple[JsonValue, JsonValue]]


@dataclass(frozen=True)
class Migrate:
    migration: StateMigration
    changed: dict[str, tuple[JsonValue, JsonValue]]


@dataclass(frozen=True)
class Refuse:
    reason: str
    changed: dict[str, tuple[JsonValue, JsonValue]]


GateDecision = Verbatim | Migrate | Refuse


def fingerprint(versions: Versions) -> dict[str, JsonValue]:
    return {f.name: getattr(versions, f.name) for f in fields(versions)}


def gate(
    started: Versions,
    running: Versions,
    policy: VersionPolicy,
    migrations: Sequence[StateMigration] = (),
) -> GateDecision:
    old, new = fingerprint(started), fingerprint(running)
    changed = {k: (old[k], new[k]) for k in FINGERPRINT_FIELDS if old[k] != new[k]}
    if not changed:
        return Verbatim({})
    if "agent_version" in changed:
        for migration in migrations:
            if (migration.from_version, migration.to_version) == changed[
                "agent_version"
            ]:
                return Migrate(migration, changed)
    refused = [k for k in changed if policy.rule(k) == "refuse"]
    if refused:
        what = ", ".join(f"{k} {changed[k][0]!r} -> {changed[k][1]!r}" for k in refused)
        hint = (
            " and no migration is registered for it"
            if "agent_version" in refused
            else ""
        )
        return Refuse(f"version_mismatch: {what}{hint}", changed)
    return Verbatim(changed)
