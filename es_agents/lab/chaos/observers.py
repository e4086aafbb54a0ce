"""What the chaos harness sees and sends, on any store: a watcher folding every run
from the events topic, and a sender that keeps retrying commands through outages."""

from __future__ import annotations

import threading
import time

from es_agents.core import RunState
from es_agents.core.commands import Command
from es_agents.core.epochs import EpochFence
from es_agents.core.fold import fold
from es_agents.errors import EsAgentsError
from es_agents.ports import EventLog


class Watcher:
    """Folds every run from the events topic as it becomes readable (committed)."""

    def __init__(self, log: EventLog, topic: str, partitions: int) -> None:
        self.states: dict[str, RunState] = {}
        self.errors: list[str] = []
        self.lock = threading.Lock()
        self._log = log
        self._topic = topic
        self._positions = dict.fromkeys(range(partitions), 0)
        # Carried from read to read: a zombie write after a claim read earlier is
        # left out like any reader from the partition's start leaves it out.
        self._fences = {p: EpochFence() for p in range(partitions)}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="watcher")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for partition in self._positions:
                try:
                    self._read(partition)
                except EsAgentsError:
                    time.sleep(0.5)  # the store is down: read again later
            self._stop.wait(0.2)

    def _read(self, partition: int) -> None:
        start = self._positions[partition]
        fence = self._fences[partition]
        for record in self._log.read_partition(
            self._topic, partition, start, floors=fence
        ):
            self._positions[partition] = record.offset + 1
            try:
                event = self._log.decode_event(record.value)
                with self.lock:
                    state = self.states.get(event.run_id)
                    if state is None:
                        state = self.states[event.run_id] = RunState(
                            run_id=event.run_id
                        )
                    fold(state, event)
            except EsAgentsError as e:
                self.errors.append(f"{partition}@{record.offset}: {e}")

    def snapshot(self) -> dict[str, tuple[str, str | None, int]]:
        """run id -> (status, waiting reason, seq)."""
        with self.lock:
            return {
                run_id: (
                    s.status,
                    s.waiting.reason if s.waiting else None,
                    s.seq,
                )
                for run_id, s in self.states.items()
            }

    def close(self) -> None:
        self._stop.set()
        self._thread.join(60)


class Sender:
    """Sends commands in order from a queue, retrying through outages."""

    def __init__(self, log: EventLog) -> None:
        self.acked: list[Command] = []
        self._log = log
        self._queue: list[Command] = []
        self._cond = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True, name="sender")
        self._thread.start()

    def send(self, command: Command) -> None:
        with self._cond:
            self._queue.append(command)
            self._cond.notify()

    @property
    def pending(self) -> int:
        with self._cond:
            return len(self._queue)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stop:
                    self._cond.wait()
                if self._stop:
                    return
                command = self._queue[0]
            try:
                self._log.send(command)
            except EsAgentsError:
                time.sleep(0.5)  # the store is down: the same command again
                continue
            with self._cond:
                self._queue.pop(0)
                self.acked.append(command)

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join(60)
