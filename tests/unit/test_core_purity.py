"""Who may import whom: the core is pure, and the runtime speaks to the world only
through its ports (``es_agents.app`` is the one place that names adapters)."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "es_agents"
DRIVERS = ("confluent_kafka", "psycopg", "psycopg_pool", "boto3", "botocore")

# The runtime: worker, run loop, effects and reconciliation, loader, command checks.
RUNTIME = (
    "es_agents.worker",
    "es_agents.run_loop",
    "es_agents.effects",
    "es_agents.model_steps",
    "es_agents.containment",
    "es_agents.ownership",
    "es_agents.offsets",
    "es_agents.resume",
    "es_agents.dead_letters",
    "es_agents.client",
    "es_agents.payloads",
    "es_agents.ports",
)


def _loaded_by(module: str, suspects: tuple[str, ...]) -> list[str]:
    code = (
        f"import sys, {module}; "
        f"print(','.join(m for m in {suspects!r} if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    return [m for m in out.stdout.strip().split(",") if m]


def test_core_imports_no_io_libraries() -> None:
    suspects = (*DRIVERS, "http.client", "urllib3", "requests", "fastavro")
    assert _loaded_by("es_agents.core", suspects) == []


@pytest.mark.parametrize("module", RUNTIME)
def test_the_runtime_loads_no_driver_and_no_adapter(module: str) -> None:
    suspects = (*DRIVERS, "es_agents.adapters", "es_agents.lab", "es_agents.app")
    assert _loaded_by(module, suspects) == []


def test_only_the_composition_root_names_adapters() -> None:
    """Outside ``es_agents/adapters``, the lab and tests, only ``app.py`` imports an
    adapter module (and the projector, the Postgres projection itself)."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith(("adapters/", "lab/", "dev/")) or rel == "app.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "es_agents.adapters"
            ):
                offenders.append(f"{rel}: {node.module}")
    assert offenders == []
