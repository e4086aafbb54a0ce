"""The agents served on a prefix, as ``es-agents agents`` and ``Client.agents``
list them: from the workers' heartbeats (the ``agents`` table)."""

from __future__ import annotations

from es_agents.ports import ServingWorker


def served_agents(
    workers: list[ServingWorker], live_within: float
) -> list[dict[str, object]]:
    """Per agent: its version, tools and gates (of the latest heartbeat), its
    workers live and stopped, and when the last heartbeat came. ``workers``: latest
    heartbeat first; a worker is live when it beat within ``live_within`` seconds
    and did not say it stopped."""
    by_agent: dict[str, list[ServingWorker]] = {}
    for w in workers:
        by_agent.setdefault(w.agent, []).append(w)

    def live(w: ServingWorker) -> bool:
        return not w.stopped and w.age_seconds <= live_within

    return [
        {
            "agent": agent,
            "agent_version": those[0].agent_version,
            "live_workers": sum(live(w) for w in those),
            "last_heartbeat": those[0].seen_at,
            "seconds_since": round(those[0].age_seconds, 1),
            "tools": those[0].tools,
            "gates": those[0].gates,
            "workers": [
                {
                    "worker_id": w.worker_id,
                    "agent_version": w.agent_version,
                    "live": live(w),
                    "stopped": w.stopped,
                    "last_heartbeat": w.seen_at,
                }
                for w in those
            ],
        }
        for agent, those in by_agent.items()
    ]
