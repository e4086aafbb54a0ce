"""``es-agents upgrade check``: what new code would do with the runs waiting now.

Before a deploy, for every run of the agent that is not finished (running, paused,
blocked, as the ``runs`` table lists them): its log is folded with the code about
to ship and the version gate decides, as a worker running that code would on the
run's next command -- continue as it is (``same``), continue and record what
changed (``verbatim``), ``migrate``, or ``refuse`` (the run would block). The new
fold is compared with the projection the old code made (status, step, events,
wait, tokens): a difference means the fold rules changed under runs in flight.
A refusal or a difference fails the check, so CI can stop the deploy.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import JsonValue

from es_agents.agent import running_versions
from es_agents.core import replay
from es_agents.core.events import Event
from es_agents.core.state import RunState, Versions
from es_agents.core.versions import Migrate, Refuse, VersionPolicy, gate
from es_agents.errors import EsAgentsError

if TYPE_CHECKING:
    from es_agents.client import Client, RunRow

NOT_FINISHED = ("running", "paused", "blocked")
BATCH = 1000  # runs whose logs are read together (one pass per partition)


@dataclass(frozen=True)
class RunVerdict:
    run_id: str
    status: str
    decision: str  # same | verbatim | migrate | refuse
    reason: str | None = None
    changed: dict[str, list[JsonValue]] = field(default_factory=dict)
    differs: str | None = None  # how the new fold differs from the projection

    @property
    def fails(self) -> bool:
        return self.decision == "refuse" or self.differs is not None


def check(client: Client, agent: Any, limit: int = 100_000) -> Iterator[RunVerdict]:
    """A verdict for each of ``agent``'s runs that are not finished."""
    running = running_versions(agent)
    policy: VersionPolicy = getattr(agent, "version_policy", VersionPolicy())
    migrations = list(getattr(agent, "migrations", []))
    for status in NOT_FINISHED:
        rows = client.runs(status, limit, agent=agent.name)
        for start in range(0, len(rows), BATCH):
            batch = rows[start : start + BATCH]
            logs = client.events_of([row.run_id for row in batch])
            for row in batch:
                events = logs.get(row.run_id)
                if events:  # none: another prefix's run (they may share a database)
                    yield _verdict(row, events, running, policy, migrations)


def _verdict(
    row: RunRow,
    events: list[Event],
    running: Versions,
    policy: VersionPolicy,
    migrations: list[Any],
) -> RunVerdict:
    """What the gate decides for a run whose log is ``events``, and how the new
    fold differs from the projection."""
    try:
        state = replay(events)
        # As far as the projector got: the projection may trail the log.
        projected = replay(events[: row.events])
    except EsAgentsError as e:
        why = f"its log does not fold with this code: {e}"
        return RunVerdict(row.run_id, row.status, "refuse", why, {}, why)
    decision = gate(state.versions, running, policy, migrations)
    changed = {k: list(v) for k, v in decision.changed.items()}
    if isinstance(decision, Refuse):
        verdict, reason = "refuse", decision.reason
    elif isinstance(decision, Migrate):
        verdict, reason = "migrate", decision.migration.description
    else:
        verdict, reason = ("verbatim" if changed else "same"), None
    return RunVerdict(
        row.run_id, row.status, verdict, reason, changed, _differs(projected, row)
    )


def _differs(state: RunState, row: RunRow) -> str | None:
    """What the new fold says otherwise than the projection (None: nothing)."""
    waiting = state.waiting
    pairs = {
        "status": (state.status, row.status),
        "step": (state.step, row.step),
        "events": (state.seq + 1, row.events),
        "waiting": (waiting.reason if waiting else None, row.waiting_reason),
        "gate": (waiting.gate if waiting else None, row.waiting_gate),
        "prompt_tokens": (state.prompt_tokens, row.prompt_tokens),
        "completion_tokens": (state.completion_tokens, row.completion_tokens),
    }
    found = [
        f"{name} {new!r} (projected {old!r})"
        for name, (new, old) in pairs.items()
        if new != old
    ]
    return "; ".join(found) or None
