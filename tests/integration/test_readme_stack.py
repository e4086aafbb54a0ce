"""The README's first agent, served by a worker from the folder it was saved in,
driven by the README's own client example against the real stack."""

from __future__ import annotations

import contextlib
import io
import subprocess
import sys
from pathlib import Path

import pytest

from es_agents.lab.demo import _env
from tests.unit.test_readme import NEEDS_STACK, README, python_blocks

pytestmark = pytest.mark.integration


def test_the_readme_first_agent_and_client_example_run(
    env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocks = python_blocks()
    agent = next(b for b in blocks if 'name="tickets"' in b)
    client = [b for b in blocks if b.startswith(NEEDS_STACK)]
    assert client
    (tmp_path / "my_agent.py").write_text(agent)
    # As the README says: `es-agents worker --agent my_agent:agent` in that folder.
    worker = subprocess.Popen(
        [sys.executable, "-m", "es_agents.cli", "worker", "--agent", "my_agent:agent"],
        cwd=tmp_path,
        env=_env(**env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            for code in client:
                exec(compile(code, str(README), "exec"), {})  # noqa: S102
    finally:
        worker.terminate()
        _, err = worker.communicate(timeout=60)
    assert worker.returncode == 0, err[-3000:]
    lines = printed.getvalue().splitlines()
    assert lines[0] == "create_ticket"
    assert lines[1] == "applied"
    assert lines[2].startswith("completed ")
