"""A newcomer's path, run as written: the README's first agent (saved where the
README says, its shell block run in a folder of its own), then the first tutorial in
the same folder — serve, start, approve, the client, a worker killed right after the
tool acted — against the real stack, each page as one bash script."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from es_agents.lab.demo import _env
from tests.doc_blocks import DOCS, README, shell_script

pytestmark = pytest.mark.integration
ROOT = README.parent


def run_page(page: Path, folder: Path, env: dict[str, str]) -> str:
    """Run the page's blocks in ``folder`` with bash (``set -euo pipefail``); the
    page's background jobs are stopped with it. Returns what it printed on stdout."""
    script = "set -euo pipefail\n" + shell_script(page)
    proc = subprocess.Popen(
        ["bash", "-c", script],
        cwd=folder,
        env=_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=420)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)  # a job the page left running
    assert proc.returncode == 0, f"{page.name} failed:\n{out[-4000:]}\n{err[-4000:]}"
    return out  # the commands' output; the logs went to stderr


def test_the_readme_then_the_first_tutorial(
    env: dict[str, str], tmp_path: Path
) -> None:
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")  # "the repository's virtualenv"
    readme = run_page(README, tmp_path, env)
    assert "awaiting_approval" in readme  # `wait --for paused`
    assert "Filed." in readme  # `wait --for completed`: the output
    assert "hash chain: intact" in readme  # `replay`
    assert "projection: consistent with the log" in readme

    tutorial = run_page(DOCS / "tutorials" / "first-agent.md", tmp_path, env)
    assert "create_ticket\napplied\ncompleted" in tutorial  # drive.py
    assert "the worker was killed (exit 137)" in tutorial
    assert "pending: tool create_ticket (key" in tutorial  # the dangling call
    assert "reconciled=True" in tutorial
    tickets = json.loads((tmp_path / "tickets.json").read_text())
    assert len(tickets) == 3  # three runs, one ticket each: none filed twice
    assert len(set(tickets)) == 3


def test_the_approvals_tutorial(env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    out = run_page(DOCS / "tutorials" / "approvals.md", tmp_path, env)
    assert out.count("refused (exit 1)") == 3  # unsigned, mallory, alice twice
    assert "['alice']" in out  # one approval of two, recorded
    assert "approval_recorded" in out
    assert "resumed" in out
    assert "reason=approved  by=bob" in out  # the quorum's second approver resumed it


def test_the_demo_tutorial(env: dict[str, str], tmp_path: Path) -> None:
    """Its first block starts the stack and the ticketing service: the test's
    fixtures provide both (ES_AGENTS_TICKETS_URL)."""
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    out = run_page(DOCS / "tutorials" / "demo.md", tmp_path, env)
    assert "the worker was killed (exit 137)" in out
    assert "pending: tool create_ticket" in out
    assert "reconciled=True" in out
    assert "projection: consistent with the log" in out


def test_the_testing_tutorial(env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")
    out = run_page(DOCS / "tutorials" / "testing.md", tmp_path, env)
    assert out.count("2 passed") == 2  # in memory, then on Kafka and Postgres
