"""The chaos run's faults for a cluster (``dev up --brokers 3``): the leader of a
busy partition or the active controller SIGKILLed, every broker restarted in turn;
what each broker fault cost (seconds to the first acknowledgement after it, the
rate while the broker was down against the minute before); and the longest stall a
run saw."""

from __future__ import annotations

import bisect
import itertools
import random
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from es_agents.core.events import Event, Interrupted
from es_agents.dev import DevStack
from es_agents.dev import cluster as dev_cluster
from es_agents.errors import EsAgentsError
from es_agents.settings import KafkaSettings

DOWN_SECONDS = 20.0  # how long a killed broker stays down (two of three serve on)
SAMPLE_SECONDS = 0.05  # how often the acknowledgements are counted
RESUMED_AFTER_GAP = 1.0  # a pause this long after a kill is the fault's stall


class AckClock:
    """Counts the acknowledgement journal's lines every ``SAMPLE_SECONDS`` on a
    thread of its own, so a fault can ask how many were acknowledged between two
    moments (the minute before a kill, the seconds a broker was down)."""

    def __init__(self, work: Path) -> None:
        self._journal = work / "acks.log"
        self._times: list[float] = []
        self._counts: list[int] = []
        self._read = 0  # bytes of the journal counted
        self._lines = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_SECONDS):
            if self._journal.exists():
                with self._journal.open("rb") as f:
                    f.seek(self._read)
                    chunk = f.read()
                self._read += len(chunk)
                self._lines += chunk.count(b"\n")
            self._times.append(time.monotonic())
            self._counts.append(self._lines)

    def count_at(self, moment: float) -> int:
        """Lines counted by the last sample at or before ``moment``."""
        i = bisect.bisect_right(self._times, moment) - 1
        return self._counts[i] if i >= 0 else 0

    def rate(self, start: float, end: float) -> float:
        start = max(start, self._times[0]) if self._times else start
        if end <= start:
            return 0.0
        return (self.count_at(end) - self.count_at(start)) / (end - start)

    def resumed(self, kill: float, end: float) -> float:
        """Seconds from ``kill`` to the first acknowledgement after the stall it
        caused (a pause of ``RESUMED_AFTER_GAP`` or more starting within the first
        seconds); 0 when acknowledgements never paused."""
        last_count, last_moved = self.count_at(kill), kill
        for t, n in zip(self._times, self._counts, strict=True):
            if t <= kill or t > end:
                continue
            if n > last_count:
                if t - last_moved >= RESUMED_AFTER_GAP:
                    return t - kill
                last_count, last_moved = n, t
        # Never resumed within the window, or never paused.
        return end - kill if end - last_moved >= RESUMED_AFTER_GAP else 0.0

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)


@dataclass(frozen=True)
class BrokerFault:
    kind: str
    broker: int
    led: int  # events partitions the broker led
    controller: bool  # the broker was the active KRaft controller
    resumed_s: float  # kill -> the first acknowledgement after the stall
    rate_before: float  # acknowledgements/s in the minute before the kill
    rate_down: float  # acknowledgements/s while it was down
    at: float  # when it was killed (epoch seconds)
    down_s: float  # how long it stayed down

    @property
    def ratio(self) -> float:
        return self.rate_down / self.rate_before if self.rate_before else 0.0


def kill_node(
    stack: DevStack,
    kafka: KafkaSettings,
    kind: str,
    rng: random.Random,
    clock: AckClock,
) -> BrokerFault:
    """SIGKILL the leader of a random events partition (or the controller), keep it
    down ``DOWN_SECONDS``, start it and wait for sync; what it cost."""
    bootstrap = kafka.bootstrap_servers
    wait_in_sync(bootstrap)
    controller = dev_cluster.controller_of(stack.brokers)
    if kind == "kill_controller":
        target = controller
    else:
        partition = rng.randrange(kafka.partitions)
        target = dev_cluster.leader_of(bootstrap, kafka.events_topic, partition)
    node = next(n for n in stack.brokers if n.node == target)
    led = sum(
        dev_cluster.leader_of(bootstrap, kafka.events_topic, p) == target
        for p in range(kafka.partitions)
    )
    killed, at = time.monotonic(), time.time()
    node.kill(signal.SIGKILL)
    time.sleep(DOWN_SECONDS)
    ended = time.monotonic()
    node.start()
    wait_in_sync(bootstrap)
    return BrokerFault(
        kind=kind,
        broker=target,
        led=led,
        controller=target == controller,
        resumed_s=round(clock.resumed(killed, ended), 2),
        rate_before=round(clock.rate(killed - 60, killed), 1),
        rate_down=round(clock.rate(killed, ended), 1),
        at=at,
        down_s=round(ended - killed, 1),
    )


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


@dataclass(frozen=True)
class Stall:
    seconds: float
    run_id: str
    after: str  # the event the run waited after
    at: float  # when it began (epoch seconds)


def longest_stalls(
    runs: dict[str, list[Event]],
    count: int = 3,
    began: tuple[float, float] | None = None,
) -> list[Stall]:
    """The longest times between two events of one run, one per run (pauses for a
    person or a timer left out: they wait on purpose), longest first; ``began``:
    only stalls that began within these epoch seconds."""
    stalls: list[Stall] = []
    for run_id, events in runs.items():
        worst: Stall | None = None
        for a, b in itertools.pairwise(events):
            if isinstance(a, Interrupted):
                continue
            if began is not None and not began[0] <= a.at.timestamp() <= began[1]:
                continue
            seconds = (b.at - a.at).total_seconds()
            if worst is None or seconds > worst.seconds:
                worst = Stall(round(seconds, 2), run_id, a.wire_name, a.at.timestamp())
        if worst is not None:
            stalls.append(worst)
    stalls.sort(key=lambda s: -s.seconds)
    return stalls[:count]
