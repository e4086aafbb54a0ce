"""A run's family: the run that started it (a sub-agent's parent) and the child
runs it started, each with its agent and status, read from the runs' events."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from es_agents.core.events import Event, StatePatched
from es_agents.core.fold import replay
from es_agents.core.state import CHILD_PREFIX
from es_agents.errors import NotFound

MAX_DEPTH = 8


def child_runs(events: Sequence[Event]) -> list[str]:
    """Every child run a run started, in order (ended ones too)."""
    return [
        str(json.loads(e.value_json))
        for e in events
        if isinstance(e, StatePatched) and e.key.startswith(CHILD_PREFIX)
    ]


def tree(
    events_of: Callable[[str], Sequence[Event]], run_id: str, depth: int = 0
) -> dict[str, object]:
    """``{"run_id", "agent", "status", "parent", "children": [...]}`` for the run
    and, recursively, its children (a child not started yet: status "pending")."""
    try:
        events = events_of(run_id)
    except NotFound:
        return {"run_id": run_id, "status": "pending", "children": []}
    state = replay(events)
    children = child_runs(events) if depth < MAX_DEPTH else []
    return {
        "run_id": run_id,
        "agent": state.agent,
        "status": state.status,
        "parent": state.parent_run_id,
        "children": [tree(events_of, c, depth + 1) for c in children],
    }


def lines(node: dict[str, object], indent: str = "") -> list[str]:
    """The tree as text, one run per line, children indented."""
    out = [f"{indent}{node['run_id']}  {node.get('agent', '?')}  {node['status']}"]
    children = node.get("children")
    for child in children if isinstance(children, list) else []:
        out.extend(lines(child, indent + "  "))
    return out
