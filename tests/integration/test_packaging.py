"""The package as users install it: the wheel built from the tree, installed with
its declared dependencies (no extras) into a fresh virtualenv, answers ``--help``,
runs an agent through a signed approval on the memory store, and makes a master
key -- so every import it needs resolves from what it declares."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_support import ROOT

pytestmark = pytest.mark.integration


def _run(*argv: str | Path, cwd: Path) -> str:
    done = subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, (argv, done.stdout[-2000:], done.stderr[-3000:])
    return done.stdout


def test_the_wheel_works_with_its_declared_dependencies_alone(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
         "--no-build-isolation", "-w", dist, ROOT, cwd=tmp_path)  # fmt: skip
    (wheel,) = dist.glob("es_agents-*.whl")
    fresh = tmp_path / "fresh"
    _run(sys.executable, "-m", "venv", fresh, cwd=tmp_path)
    _run(fresh / "bin" / "pip", "install", "-q", wheel, cwd=tmp_path)
    installed = _run(fresh / "bin" / "pip", "list", "--format=freeze", cwd=tmp_path)
    for extra in ("pytest", "mcp", "pydantic-ai", "openai-agents", "mkdocs"):
        assert f"\n{extra}==" not in "\n" + installed.lower(), extra
    assert "Usage: es-agents" in _run(
        fresh / "bin" / "es-agents", "--help", cwd=tmp_path
    )
    script = ROOT / "tests" / "integration" / "packaged_run.py"
    said = _run(fresh / "bin" / "python", script, cwd=tmp_path)  # not the tree's
    assert "completed; sent [5]" in said
    assert f"es_agents from {fresh}" in said  # the installed wheel, not the tree
    key = _run(fresh / "bin" / "es-agents", "vault", "new-master-key", cwd=tmp_path)
    assert len(key.strip()) == 44  # base64 of 32 bytes
