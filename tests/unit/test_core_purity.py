"""Who may import whom: the core is pure, and the runtime speaks to the world only
through its ports (``es_agents.app`` is the one place that names adapters)."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "es_agents"
DRIVERS = ("confluent_kafka", "psycopg", "psycopg_pool", "boto3", "botocore")

# The runtime (every module of the package, found on disk: a new one is guarded as
# it lands) and the modules beside it that the runtime and the client stand on.
RUNTIME = (
    *sorted(
        f"es_agents.runtime.{p.stem}"
        for p in (PACKAGE / "runtime").glob("*.py")
        if p.stem != "__init__"
    ),
    "es_agents.runtime",
    "es_agents.dead_letters",
    "es_agents.client",
    "es_agents.payloads",
    "es_agents.ports",
)
# What each layer may import of the package's own modules (folders and modules):
# the core only itself; the runtime no adapter, no lab, no composition root, no CLI.
FORBIDDEN = {
    "core": ("es_agents",),
    "runtime": (
        "es_agents.adapters",
        "es_agents.lab",
        "es_agents.app",
        "es_agents.cli",
    ),
}
ALLOWED_IN_CORE = ("es_agents.core", "es_agents.errors")


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


def _imports(path: Path) -> list[str]:
    """Every module ``path`` imports, at any depth of its code (type-only too)."""
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names.extend(a.name for a in node.names)
    return names


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_each_layer_imports_only_what_it_may(layer: str) -> None:
    """By folder: ``core/`` imports only the core and the errors; ``runtime/``
    never an adapter, the lab, the composition root or the CLI."""
    offenders = []
    for path in (PACKAGE / layer).rglob("*.py"):
        for name in _imports(path):
            if layer == "core" and _within(name, ALLOWED_IN_CORE):
                continue
            if _within(name, FORBIDDEN[layer]) or name.split(".")[0] in DRIVERS:
                offenders.append(f"{path.relative_to(PACKAGE)}: {name}")
    assert offenders == []


def _within(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)
