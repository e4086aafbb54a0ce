"""Every import of the installed package resolves from its declared dependencies
(without extras): each third-party module es-agents and its projectors import
comes from a distribution that ``pip install es-agents`` brings, directly or
through another. The integrations (``es_agents.integrations``: the extras) and the
pytest plugin (``es_agents.testing``) are left out."""

from __future__ import annotations

import ast
import re
import sys
from importlib import metadata

from packaging.requirements import Requirement

from tests.test_support import ROOT

LEFT_OUT = ("es_agents/integrations/", "es_agents/testing.py")
OWN = {"es_agents", "projectors", "tests"}


def _imported() -> dict[str, set[str]]:
    """Top-level module -> the files that import it."""
    found: dict[str, set[str]] = {}
    for path in [*ROOT.glob("es_agents/**/*.py"), *ROOT.glob("projectors/**/*.py")]:
        name = path.relative_to(ROOT).as_posix()
        if name.startswith(LEFT_OUT):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            modules: list[str] = []
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            for module in modules:
                found.setdefault(module.partition(".")[0], set()).add(name)
    return found


def _requirements(dist: str, extras: frozenset[str]) -> list[Requirement]:
    """What a distribution requires, with the extras asked of it (and no other)."""
    out = []
    for line in metadata.requires(dist) or []:
        requirement = Requirement(line)
        marker = requirement.marker
        if marker is None or any(
            marker.evaluate({"extra": extra}) for extra in (*extras, "")
        ):
            out.append(requirement)
    return out


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _closure(root: str) -> set[str]:
    """The distributions ``pip install root`` brings (no extras of root)."""
    seen: set[tuple[str, frozenset[str]]] = set()
    todo: list[tuple[str, frozenset[str]]] = [(root, frozenset())]
    while todo:
        name, extras = todo.pop()
        key = (_normal(name), extras)
        if key in seen:
            continue
        seen.add(key)
        try:
            todo.extend(
                (r.name, frozenset(r.extras)) for r in _requirements(name, extras)
            )
        except metadata.PackageNotFoundError:
            continue
    return {name for name, _ in seen}


def test_every_import_comes_from_a_declared_dependency() -> None:
    brought = _closure("es-agents")
    providers = metadata.packages_distributions()
    missing = {}
    for module, files in sorted(_imported().items()):
        if module in OWN or module in sys.stdlib_module_names or module == "__future__":
            continue
        dists = {_normal(d) for d in providers.get(module, [])}
        if not dists & brought:
            missing[module] = sorted(files)
    assert missing == {}, (
        f"imported but not brought by es-agents' dependencies: {missing}"
    )
