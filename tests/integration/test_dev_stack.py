"""`dev up | status | down` on a second, private stack (other ports, other home), so
the shared stack of the test session keeps running."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from es_agents.dev import DevSettings, DevStack

pytestmark = pytest.mark.integration


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_up_is_idempotent_status_answers_and_down_stops_what_up_started(
    tmp_path: Path, dev_stack: DevStack
) -> None:
    # Ports below the kernel's ephemeral range (32768-60999 here): a client socket of
    # another test may hold any port in it (45432 was taken so once in CI).
    dev = DevSettings(
        home=tmp_path / "stack",
        kafka_port=29092,
        kafka_controller_port=29093,
        postgres_port=25432,
        s3_port=29000,
    )
    stack = DevStack(dev)
    lines: list[str] = []
    try:
        stack.up(log=lines.append)
        assert sorted(lines) == ["kafka: started", "postgres: started", "s3: started"]
        statuses = stack.status()
        assert all(s.answers and s.pid is not None for s in statuses), statuses
        pids = {s.name: s.pid for s in statuses}

        lines.clear()
        stack.up(log=lines.append)  # warm: nothing restarts
        assert sorted(lines) == [
            "kafka: already running",
            "postgres: already running",
            "s3: already running",
        ]
        assert {s.name: s.pid for s in stack.status()} == pids
    finally:
        stack.down(log=lambda _line: None)
    assert not any(s.answers or s.pid for s in stack.status())
    for port in (29092, 29093, 25432, 29000):
        assert not _listening(port)
    # The session's own stack was left alone.
    assert all(s.answers for s in dev_stack.status())
