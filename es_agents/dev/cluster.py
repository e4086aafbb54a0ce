"""A local Kafka cluster's nodes (``dev up --brokers 3``): starting them together,
and who leads what -- for the cluster's tests and chaos faults."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from es_agents.dev.config import DevSettings
from es_agents.dev.kafka import DevKafka, new_cluster_id


def prepare(dev: DevSettings) -> None:
    """Record the broker count and whether ACLs are on, and the cluster id every
    node formats with."""
    home = dev.root / "kafka"
    home.mkdir(parents=True, exist_ok=True)
    # Written aside and renamed: another process reading it (a second `dev up`,
    # a test process) sees the old value or the new, never an empty file.
    for name, value in (
        ("brokers", dev.brokers),
        ("acls", "on" if dev.acls else "off"),
    ):
        aside = home / f"{name}.{os.getpid()}"
        aside.write_text(f"{value}\n")
        aside.replace(home / name)
    dev.kafka_home.mkdir(parents=True, exist_ok=True)
    shared = dev.kafka_home / "cluster.id"
    if dev.brokers > 1 and not shared.exists():
        shared.write_text(new_cluster_id())


def start_all(nodes: Sequence[DevKafka]) -> list[bool]:
    """Start the nodes together (each waits for the others' quorum)."""
    if nodes:
        nodes[0].install()
    with ThreadPoolExecutor(max_workers=max(len(nodes), 1)) as pool:
        return list(pool.map(lambda node: node.start(), nodes))


def stop_all(nodes: Sequence[DevKafka]) -> list[bool]:
    """Stop the nodes together: stopped one by one, the last has no controller
    quorum left to shut down with and waits out its timeout (61.8 s measured for
    three, 6.5 s together). True for each node that was running."""
    with ThreadPoolExecutor(max_workers=max(len(nodes), 1)) as pool:
        return list(pool.map(lambda node: node.stop(), nodes))


def leader_of(bootstrap: str, topic: str, partition: int) -> int:
    """The broker id leading ``topic``'s ``partition`` now."""
    from confluent_kafka.admin import AdminClient  # noqa: PLC0415

    meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return int(meta.topics[topic].partitions[partition].leader)


def controller_of(nodes: Sequence[DevKafka]) -> int:
    """The node id of the active KRaft controller: the leader of the newest epoch
    in the running nodes' ``quorum-state`` files (each node writes there the leader
    it follows). A client cannot ask: on a KRaft cluster the ``controller`` that
    DescribeCluster and Metadata answer is a random live broker, not the active
    controller."""
    newest: tuple[int, int] | None = None  # (epoch, leader)
    for node in nodes:
        if node.proc.pid() is None:
            continue
        state = node.data / "__cluster_metadata-0" / "quorum-state"
        try:
            found = json.loads(state.read_text())
        except (OSError, ValueError):
            continue
        epoch, leader = (
            int(found.get("leaderEpoch", -1)),
            int(found.get("leaderId", -1)),
        )
        if leader >= 0 and (newest is None or epoch > newest[0]):
            newest = (epoch, leader)
    if newest is None:
        raise RuntimeError("no running node names an active controller")
    return newest[1]


def fully_replicated(bootstrap: str) -> bool:
    """Every partition's replicas are all in sync (no under-replicated partition):
    when a rolling restart may take the next broker down."""
    from confluent_kafka import KafkaException  # noqa: PLC0415
    from confluent_kafka.admin import AdminClient  # noqa: PLC0415

    try:
        meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    except KafkaException:
        return False
    return all(
        len(p.isrs) == len(p.replicas)
        for topic in meta.topics.values()
        for p in topic.partitions.values()
    )
