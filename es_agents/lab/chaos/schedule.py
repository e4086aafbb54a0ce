"""The fault schedule: which fault happens when, from a seed alone (pure).

Faults come in rounds; each round has every kind once, in a seeded order, so a short
run still sees each kind. Before each fault the system gets a quiet gap drawn around
``mean_gap`` seconds, counted from the end of the previous fault (a broker restart
takes seconds; faults never pile up behind a slow one). The same seed, duration and
worker count give the same schedule, printed with its fingerprint so two runs can be
compared; how many of its faults fit in the window depends on how long they take.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, dataclass

KINDS = (
    "kill_worker",  # SIGKILL a worker now; its replacement dies at a protocol point
    "pause_worker",  # SIGSTOP a worker past its session timeout, then SIGCONT
    "kill_broker",  # SIGKILL the Kafka broker, start it again
    "restart_postgres",  # stop Postgres (fast), start it again
    "kill_projector",  # SIGKILL the projector; a new one starts
)
# On a cluster (dev up --brokers 3), kill_broker kills the leader of a busy
# partition and these join the rounds.
CLUSTER_KINDS = (
    "kill_controller",  # SIGKILL the active controller, start it again
    "rolling_restart",  # stop and start each broker in turn, each back in sync first
)

# Where a replacement worker SIGKILLs itself (ES_AGENTS_CRASH_AT), the n-th time.
CRASH_POINTS = (
    "after_append:model_call_requested",
    "after_action:model",
    "before_append:tool_call_requested",
    "after_append:tool_call_requested",
    "after_claim:tool",
    "after_action:tool",
    "after_append:tool_returned",
    "after_append:interrupted",
    "after_append:resumed",
    "before_append:run_completed",
)


@dataclass(frozen=True)
class Fault:
    gap: float  # quiet seconds between the end of the previous fault and this one
    kind: str
    worker: int = -1  # which worker, for worker faults
    crash_at: str = ""  # ES_AGENTS_CRASH_AT of the replacement, for kill_worker


def fault_schedule(
    seed: int,
    seconds: float,
    workers: int,
    mean_gap: float = 9.0,
    cluster: bool = False,
) -> list[Fault]:
    if workers < 1:
        raise ValueError("a chaos run needs at least one worker")
    rng = random.Random(seed)  # noqa: S311 - reproducible, not secret
    faults: list[Fault] = []
    gap = rng.uniform(0.3, 0.7) * mean_gap
    total = 0.0
    while True:
        kinds = list(KINDS) + (list(CLUSTER_KINDS) if cluster else [])
        rng.shuffle(kinds)
        for kind in kinds:
            total += gap
            if total >= seconds:
                return faults
            worker = rng.randrange(workers) if kind.endswith("_worker") else -1
            crash_at = (
                f"{rng.choice(CRASH_POINTS)}@{rng.randint(1, 3)}"
                if kind == "kill_worker"
                else ""
            )
            faults.append(Fault(round(gap, 2), kind, worker, crash_at))
            gap = rng.uniform(0.5, 1.5) * mean_gap


def fingerprint(faults: list[Fault]) -> str:
    text = json.dumps([asdict(f) for f in faults], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
