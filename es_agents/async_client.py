"""``es_agents.AsyncClient``: the client for asyncio applications.

The same checks and results as ``Client``; each call runs the blocking client in a
worker thread (``asyncio.to_thread``), so the event loop never waits on Kafka or
Postgres, and ``wait`` sleeps with ``asyncio.sleep`` between looks.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterable, Mapping
from datetime import datetime, timedelta
from typing import Literal

from es_agents.approvals import SigningKey
from es_agents.client import (
    FINISHED_OR_WAITING,
    SIGNED_FOR,
    Client,
    CommandResult,
    Reply,
    RunRow,
    RunView,
    Waiting,
)
from es_agents.core.budget import Budget
from es_agents.core.events import Event
from es_agents.errors import NotFound
from es_agents.ports import Delta, Ports
from es_agents.settings import Settings


class AsyncClient:
    def __init__(
        self, settings: Settings | None = None, *, ports: Ports | None = None
    ) -> None:
        self.sync = Client(settings, ports=ports)

    async def close(self) -> None:
        await asyncio.to_thread(self.sync.close)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def start(
        self,
        agent: str,
        input_json: object = "{}",
        run_id: str | None = None,
        wait: float = 10.0,
        *,
        unserved: Literal["queue", "refuse"] = "queue",
        budget: Budget | Mapping[str, object] | None = None,
        tenant: str | None = None,
        priority: int = 0,
    ) -> CommandResult:
        return await asyncio.to_thread(
            lambda: self.sync.start(
                agent,
                input_json,
                run_id,
                wait,
                unserved=unserved,
                budget=budget,
                tenant=tenant,
                priority=priority,
            )
        )

    async def fork(
        self,
        origin_run: str,
        at_seq: int,
        run_id: str | None = None,
        by: str | None = None,
        wait: float = 10.0,
    ) -> CommandResult:
        return await asyncio.to_thread(
            self.sync.fork, origin_run, at_seq, run_id, by, wait
        )

    async def approve(
        self,
        run_id: str,
        by: str,
        gate: str | None = None,
        comment: str | None = None,
        wait: float = 10.0,
        *,
        key: SigningKey | None = None,
        valid_for: timedelta = SIGNED_FOR,
    ) -> CommandResult:
        return await asyncio.to_thread(
            lambda: self.sync.approve(
                run_id, by, gate, comment, wait, key=key, valid_for=valid_for
            )
        )

    async def reject(
        self,
        run_id: str,
        by: str,
        gate: str | None = None,
        reason: str | None = None,
        wait: float = 10.0,
        *,
        key: SigningKey | None = None,
        valid_for: timedelta = SIGNED_FOR,
    ) -> CommandResult:
        return await asyncio.to_thread(
            lambda: self.sync.reject(
                run_id, by, gate, reason, wait, key=key, valid_for=valid_for
            )
        )

    async def provide_input(
        self, run_id: str, by: str, input_json: str, wait: float = 10.0
    ) -> CommandResult:
        return await asyncio.to_thread(
            self.sync.provide_input, run_id, by, input_json, wait
        )

    async def send_message(
        self, run_id: str, text: str, by: str, wait: float = 10.0, *, end: bool = False
    ) -> CommandResult:
        return await asyncio.to_thread(
            lambda: self.sync.send_message(run_id, text, by, wait, end=end)
        )

    async def say(
        self, run_id: str, text: str, by: str, timeout: float = 120.0
    ) -> Reply:
        return await asyncio.to_thread(self.sync.say, run_id, text, by, timeout)

    def stream(self, run_id: str, timeout: float | None = None) -> AsyncIterator[Delta]:
        """``Client.stream`` as an async iterator."""
        return astream(self.sync, run_id, timeout)

    async def cancel(
        self, run_id: str, by: str, reason: str | None = None, wait: float = 10.0
    ) -> CommandResult:
        return await asyncio.to_thread(self.sync.cancel, run_id, by, reason, wait)

    async def status(self, run_id: str) -> RunView:
        return await asyncio.to_thread(self.sync.status, run_id)

    async def events(self, run_id: str) -> list[Event]:
        return await asyncio.to_thread(self.sync.events, run_id)

    async def runs(
        self,
        status: str | None = None,
        limit: int = 100,
        *,
        agent: str | None = None,
        since: datetime | None = None,
    ) -> list[RunRow]:
        return await asyncio.to_thread(
            lambda: self.sync.runs(status, limit, agent=agent, since=since)
        )

    async def wait(
        self,
        run_id: str,
        until: Iterable[str] = FINISHED_OR_WAITING,
        timeout: float = 60.0,
    ) -> RunView:
        """As ``Client.wait``, sleeping on the event loop between looks."""
        waiting = Waiting(run_id, frozenset(until), timeout)
        while True:
            try:
                view: RunView | None = await self.status(run_id)
            except NotFound:
                view = None
            if (arrived := waiting.arrived(view)) is not None:
                return arrived
            await asyncio.sleep(waiting.pause())


async def astream(
    client: Client, run_id: str, timeout: float | None = None
) -> AsyncIterator[Delta]:
    """``client.stream`` as an async iterator: read on a thread, each delta handed
    to the event loop as it comes; leaving the iteration early stops the thread's
    read too."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Delta | BaseException | None] = asyncio.Queue()
    cancel = threading.Event()

    def pump() -> None:
        try:
            for delta in client.stream(run_id, timeout, cancel):
                loop.call_soon_threadsafe(queue.put_nowait, delta)
                if cancel.is_set():
                    return
        except BaseException as e:
            loop.call_soon_threadsafe(queue.put_nowait, e)
        finally:
            loop.call_soon_threadsafe(queue.put_nowait, None)

    pumping = loop.run_in_executor(None, pump)
    try:
        while (item := await queue.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        cancel.set()
        await pumping
