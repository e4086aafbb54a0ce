"""Running an integration's coroutine to its end from plain code (listing an
MCP server's tools, reading a Pydantic AI agent) -- on a thread of its own when
the caller's thread already runs an event loop (a worker importing its agent)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar, cast

T = TypeVar("T")


def run_to_end(job: Coroutine[Any, Any, T], name: str = "integration") -> T:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(job)
    box: list[Any] = []

    def on_thread() -> None:
        try:
            box.append(asyncio.run(job))
        except BaseException as e:
            box.append(e)

    thread = threading.Thread(target=on_thread, name=name, daemon=True)
    thread.start()
    thread.join()
    if isinstance(box[0], BaseException):
        raise box[0]
    return cast(T, box[0])
