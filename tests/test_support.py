"""Synthetic run logs for tests."""

from __future__ import annotations

import json
import random
import socket
from pathlib import Path

from es_agents.core.events import Event, RunStarted, StatePatched
from es_agents.lab.demo import script

ROOT = Path(__file__).resolve().parent.parent  # the repo: tests import tests.*


def script_of(
    run_id: str, rng: random.Random, patches: int | None = None
) -> list[Event]:
    """A demo-shaped log with random length; ``patches`` makes it long and open."""
    if patches is None:
        return script(run_id, steps=rng.randint(1, 6))
    events: list[Event] = [
        RunStarted(
            run_id=run_id, seq=0, step=0, agent="x", input_json="{}", command_id="c"
        )
    ]
    events += [
        StatePatched(
            run_id=run_id, seq=n, step=0, key=f"k{n % 7}", value_json=json.dumps(n)
        )
        for n in range(1, patches + 1)
    ]
    return events


def unsealed(events: list[Event]) -> list[Event]:
    """Events as a test made them: without the ``prev`` the log's sealing set."""
    return [e.model_copy(update={"prev": b""}) for e in events]


def free_port() -> int:
    """A local TCP port nothing listens on (as of now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def migrated_database(stack: object, name: str) -> str:
    """A new database ``name`` on the dev stack's Postgres, migrated; its URL."""
    from es_agents.adapters.postgres import Database  # noqa: PLC0415
    from es_agents.dev import DevStack  # noqa: PLC0415

    assert isinstance(stack, DevStack)
    stack.postgres.create_database(name)
    url = stack.dev.database_url.rsplit("/", 1)[0] + f"/{name}"
    db = Database(url, max_size=1)
    try:
        db.migrate()
    finally:
        db.close()
    return url
