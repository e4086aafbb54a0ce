"""The chaos run's faults for a cluster (``dev up --brokers 3``): the leader of a
busy partition or the active controller SIGKILLed, every broker restarted in turn;
and the longest stall a run saw."""

from __future__ import annotations

import itertools
import random
import signal
import time
from pathlib import Path

from es_agents.core.events import Event, Interrupted
from es_agents.dev import DevStack
from es_agents.dev import cluster as dev_cluster
from es_agents.errors import EsAgentsError
from es_agents.settings import KafkaSettings

DOWN_SECONDS = 8.0  # how long a killed broker stays down (two of three serve on)


def kill_node(
    stack: DevStack, kafka: KafkaSettings, kind: str, rng: random.Random, work: Path
) -> float:
    """SIGKILL the leader of a random events partition (or the controller), keep it
    down ``DOWN_SECONDS``, start it and wait for sync; returns the acknowledgements
    per second while it was down."""
    bootstrap = kafka.bootstrap_servers
    if kind == "kill_controller":
        target = dev_cluster.controller_of(bootstrap)
    else:
        partition = rng.randrange(kafka.partitions)
        target = dev_cluster.leader_of(bootstrap, kafka.events_topic, partition)
    node = next(n for n in stack.brokers if n.node == target)
    wait_in_sync(bootstrap)
    node.kill(signal.SIGKILL)
    before, began = _acks(work), time.monotonic()
    time.sleep(DOWN_SECONDS)
    rate = (_acks(work) - before) / (time.monotonic() - began)
    node.start()
    wait_in_sync(bootstrap)
    return rate


def rolling_restart(stack: DevStack, bootstrap: str) -> None:
    """Stop and start each broker in turn, each in sync before the next goes."""
    for node in stack.brokers:
        wait_in_sync(bootstrap)
        node.stop()
        node.start()


def wait_in_sync(bootstrap: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not dev_cluster.fully_replicated(bootstrap):
        if time.monotonic() > deadline:
            raise EsAgentsError(f"the cluster was not back in sync in {timeout:g} s")
        time.sleep(0.5)


def longest_stall(runs: dict[str, list[Event]]) -> float:
    """The longest time between two events of one run (pauses for a person or a
    timer left out: they wait on purpose)."""
    longest = 0.0
    for events in runs.values():
        for a, b in itertools.pairwise(events):
            if not isinstance(a, Interrupted):
                longest = max(longest, (b.at - a.at).total_seconds())
    return round(longest, 2)


def _acks(work: Path) -> int:
    journal = work / "acks.log"
    return journal.read_bytes().count(b"\n") if journal.exists() else 0
