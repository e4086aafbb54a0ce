"""The built wheel, installed into a fresh virtualenv outside the repo, serves an
agent defined in a user's own module: ``--help``, ``start``, a worker, ``approve``.

The new environment reuses this one's third-party packages (a path entry, so the
editable install of the repo is not seen) and gets es-agents from the wheel alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
import uuid
from pathlib import Path

import pytest

from tests.test_support import ROOT

pytestmark = pytest.mark.integration

USER_AGENT = """
from pydantic import BaseModel, JsonValue

from es_agents.agent import ToolAgent
from es_agents.models import ScriptedModel, call, reply
from es_agents.tools import ToolContext, tool


class Note(BaseModel):
    text: str


@tool(Note, requires_approval=True, honors_idempotency_key=True)
def publish(args: Note, ctx: ToolContext) -> JsonValue:
    return {"published": args.text, "key": ctx.idempotency_key}


agent = ToolAgent(
    name="publisher",
    system_prompt="Publish one note, then stop.",
    model=ScriptedModel([call("publish", "p1", text="hello"), reply("published")]),
    tool_list=[publish],
)
"""


def _run(venv: Path, cwd: Path, env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [str(venv / "bin" / "es-agents"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, (args, done.stdout, done.stderr[-3000:])
    return done.stdout


def test_the_wheel_serves_a_users_agent(
    tmp_path: Path, env: dict[str, str], dev_stack: object
) -> None:
    dist = tmp_path / "dist"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(dist),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = dist.glob("es_agents-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    site = next((venv / "lib").glob("python*/site-packages"))
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", "--no-deps", str(wheel)],
        check=True,
        timeout=300,
    )
    project = tmp_path / "project"
    project.mkdir()
    (project / "publisher.py").write_text(textwrap.dedent(USER_AGENT))
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run_env = {**clean, **env}

    where = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import es_agents; print(es_agents.__file__)",
        ],
        cwd=project,
        env=run_env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert str(site) in where  # from the wheel, not the repo
    assert "worker" in _run(venv, project, run_env, "--help")
    run_id = f"wheel-{uuid.uuid4().hex[:8]}"
    _run(
        venv, project, run_env, "start", "publisher", "--run-id", run_id, "--no-wait",
        "--queue",
    )  # fmt: skip
    _run(venv, project, run_env, "worker", "--agent", "publisher:agent", "--until-idle")
    paused = json.loads(_run(venv, project, run_env, "status", run_id, "--json"))
    assert (paused["status"], paused["gate"]) == ("paused", "publish")
    _run(venv, project, run_env, "approve", run_id, "--by", "alice", "--no-wait")
    _run(venv, project, run_env, "worker", "--agent", "publisher:agent", "--until-idle")
    done = json.loads(_run(venv, project, run_env, "status", run_id, "--json"))
    assert done["status"] == "completed"
    assert done["tool_calls"] == 1
