"""``es_agents.serve``: a worker and a projector hosted in an application's own
process (``es-agents serve`` is the same as child processes).

Each member runs on a thread of its own and is kept running the way the
supervisor keeps ``es-agents serve``'s children: crash-only, a member that lost
Kafka or Postgres (``Unavailable``, ``AppendError``) is built again after a
backoff that doubles from 1 s to 30 s and resets once it has stayed up 30 s; a
configuration error stops everything and is raised by ``wait`` and on leaving the
``with`` block. One log line per change of a member's state, not per retry.

::

    from es_agents import serve

    with serve(agent) as serving:    # returns once both members are started
        app.run()                    # your web server, your scheduler, ...
    # leaving the block stops them (runs stop at the end of their step)
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from es_agents.agent import Agent
from es_agents.errors import AppendError, ConfigError, Unavailable
from es_agents.settings import Settings, load_settings

log = logging.getLogger(__name__)

FIRST_BACKOFF = 1.0
MAX_BACKOFF = 30.0
HEALTHY_AFTER = 30.0


class Member(Protocol):
    def run(self) -> None: ...

    def stop(self) -> None: ...


@dataclass
class MemberState:
    name: str
    state: str = "starting"  # starting | up | down | stopped | failed
    restarts: int = 0
    last_error: str | None = None


class Serving:
    """The members running in this process; ``stop`` them, ``wait`` for them, or
    use it as a context manager. ``states``: each member's state now."""

    def __init__(
        self,
        builders: dict[str, Callable[[], Member]],
        first_backoff: float = FIRST_BACKOFF,
    ) -> None:
        self._builders = builders
        self._first_backoff = first_backoff
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._current: dict[str, Member] = {}
        self._fatal: BaseException | None = None
        self.states = {name: MemberState(name) for name in builders}
        self._threads = [
            threading.Thread(
                target=self._keep, args=(name,), name=f"es-{name}", daemon=True
            )
            for name in builders
        ]
        for thread in self._threads:
            thread.start()

    def __enter__(self) -> Serving:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return not self._stop.is_set()

    def stop(self, timeout: float = 90.0) -> None:
        """Stop every member (a worker's runs stop at the end of their step) and
        wait for them; raises the configuration error that stopped them, if any."""
        self._stop.set()
        with self._lock:
            members = list(self._current.values())
        for member in members:
            member.stop()
        for thread in self._threads:
            thread.join(timeout)
        if self._fatal is not None:
            raise self._fatal

    def wait(self) -> None:
        """Block until the members stop (``stop`` from another thread, or a
        configuration error, which is raised)."""
        for thread in self._threads:
            while thread.is_alive():
                thread.join(0.5)
        if self._fatal is not None:
            raise self._fatal

    def _keep(self, name: str) -> None:
        state = self.states[name]
        backoff = self._first_backoff
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                lost = self._run_once(name, state)
            except (ConfigError, ImportError) as e:
                self._said(state, "failed", str(e))
                self._fatal = e
                self._stop.set()
                self._stop_others(name)
                return
            if lost is None:
                break  # stopped
            if time.monotonic() - started >= HEALTHY_AFTER:
                backoff = self._first_backoff
            state.restarts += 1
            self._said(state, "down", f"{lost}; next try in {backoff:g} s")
            self._stop.wait(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF)
        self._said(state, "stopped")

    def _run_once(self, name: str, state: MemberState) -> str | None:
        """Build and run the member until it stops (None) or loses a service
        (what it lost)."""
        try:
            member = self._builders[name]()
            with self._lock:
                self._current[name] = member
            if self._stop.is_set():
                member.stop()
            self._said(state, "up")
            member.run()
        except (Unavailable, AppendError) as e:
            return str(e)
        finally:
            with self._lock:
                self._current.pop(name, None)
        return None if self._stop.is_set() else f"{name} returned"

    def _stop_others(self, name: str) -> None:
        with self._lock:
            members = [m for n, m in self._current.items() if n != name]
        for member in members:
            member.stop()

    def _said(self, state: MemberState, new: str, why: str | None = None) -> None:
        if state.state == new and new != "down":
            return
        if new == "down" and state.state == "down" and state.last_error == why:
            return  # the same outage again: said once
        state.state, state.last_error = new, why
        line = f"{state.name}: {new}" + (f" ({why})" if why else "")
        (log.error if new == "failed" else log.info)(line)


def serve(
    agent: Agent,
    settings: Settings | None = None,
    *,
    projector: bool = True,
    instance_id: str | None = None,
    **worker_options: Any,
) -> Serving:
    """Serve ``agent`` from this process: a worker, and a projector unless
    ``projector=False`` (or the store is memory), each on a thread, kept running
    across broker and database outages. Returns at once; see ``Serving``.
    ``worker_options``: those of ``es_agents.app.build_worker`` (``threads``, ...)."""
    from es_agents.app import build_projector, build_worker  # noqa: PLC0415

    s = settings if settings is not None else load_settings()

    def worker() -> Member:
        return build_worker(s, agent, instance_id=instance_id, **worker_options)

    builders: dict[str, Callable[[], Member]] = {"worker": worker}
    if projector and s.store != "memory":
        own = {"instance_id": f"{instance_id}-projector"} if instance_id else {}

        def project() -> Member:
            return build_projector(s, **own)

        builders["projector"] = project
    return Serving(builders)
