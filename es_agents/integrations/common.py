"""What the integrations share: running a coroutine to its end from plain code
(listing an MCP server's tools, reading an agent) and reading a run's input as
the user's prompt."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar, cast

T = TypeVar("T")


def run_to_end(job: Coroutine[Any, Any, T], name: str = "integration") -> T:
    """``job`` to its end: on this thread, or on one of its own when this thread
    already runs an event loop (a worker importing its agent)."""
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


def user_prompt(content: object) -> str:
    """A run's input as the user's prompt: a JSON string's text, an object's
    ``prompt``, else the JSON itself."""
    text = str(content or "")
    try:
        value = json.loads(text)
    except ValueError:
        return text
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("prompt"), str):
        return str(value["prompt"])
    return text


def json_or_text(text: str) -> Any:
    """A tool's recorded result: its JSON value, or the text when it is none."""
    try:
        return json.loads(text)
    except ValueError:
        return text
