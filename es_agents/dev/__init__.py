"""``es-agents dev``: the local Kafka + Postgres + S3 stack, without Docker."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from es_agents.dev import cluster, secured
from es_agents.dev.config import KAFKA_VERSION, S3PROXY_VERSION, DevSettings
from es_agents.dev.kafka import DevKafka
from es_agents.dev.postgres import DevPostgres
from es_agents.dev.s3 import DevS3

__all__ = [
    "KAFKA_VERSION",
    "S3PROXY_VERSION",
    "DevSettings",
    "DevStack",
    "ServiceStatus",
]


class Service(Protocol):
    name: str

    @property
    def endpoint(self) -> str: ...

    def start(self) -> bool: ...

    def stop(self) -> bool: ...

    def answers(self) -> bool: ...


@dataclass(frozen=True)
class ServiceStatus:
    name: str
    endpoint: str
    pid: int | None
    answers: bool


class DevStack:
    def __init__(self, dev: DevSettings | None = None) -> None:
        self.dev = dev if dev is not None else DevSettings()
        self.brokers = [
            DevKafka(self.dev, node=n) for n in range(1, self.dev.brokers + 1)
        ]
        self.kafka = self.brokers[0]
        self.postgres = DevPostgres(self.dev)
        self.s3 = DevS3(self.dev)

    @property
    def services(self) -> list[Service]:
        return [*self.brokers, self.postgres, self.s3]

    def up(self, log: Callable[[str], None] = print) -> float:
        """Start what is not running (in parallel: a cluster's nodes wait for each
        other's quorum); return the seconds it took."""
        started = time.monotonic()
        self.dev.root.mkdir(parents=True, exist_ok=True)
        cluster.prepare(self.dev)  # the broker count (for status, down), cluster id
        if len(self.brokers) > 1:
            self.kafka.install()  # once, before the nodes start together
        with ThreadPoolExecutor(max_workers=len(self.services)) as pool:
            results = {s.name: pool.submit(s.start) for s in self.services}
            for name, future in results.items():
                log(f"{name}: {'started' if future.result() else 'already running'}")
        if self.dev.acls:
            count = secured.provision(self.dev)
            log(f"kafka: topics and {count} ACLs of the worker, client and projector")
        return time.monotonic() - started

    def down(self, log: Callable[[str], None] = print) -> None:
        """Stop everything, a cluster's brokers together (``cluster.stop_all``)."""
        rest = [s for s in reversed(self.services) if not isinstance(s, DevKafka)]
        for service in rest:
            log(f"{service.name}: {'stopped' if service.stop() else 'was not running'}")
        brokers = list(reversed(self.brokers))
        for broker, ran in zip(brokers, cluster.stop_all(brokers), strict=True):
            log(f"{broker.name}: {'stopped' if ran else 'was not running'}")

    def status(self) -> list[ServiceStatus]:
        return [
            ServiceStatus(s.name, s.endpoint, s.proc.pid(), s.answers())  # type: ignore[attr-defined]
            for s in self.services
        ]
