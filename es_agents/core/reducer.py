"""The reducer's version, derived from the fold's code rather than kept by hand.

A run's state is the fold of its events (``core/fold.py``). When the fold's rules
change, old events fold to other states, which is where silent corruption lives: so
every run records the reducer version it started under, snapshots are kept per
version, and the version gate refuses by default to continue a run under another
(``core/versions.py``).

``reducer_version()`` is derived from the source of the modules that make up the fold:
``core/fold.py`` and every ``es_agents.core`` module it imports, followed through
their imports (``reducer_modules()``). Their text without comments, docstrings or
runs of whitespace is hashed (SHA-256; 31 bits, so it fits the Avro and Postgres
integers that record it). A change to what those modules do changes the version;
a comment, a docstring or re-indenting does not. The event classes
(``core/events.py``) are left out: their schemas evolve with defaults that old
records decode to (a new field changes nothing the fold did before), and each is
checked against its registered Avro schema.

What the derivation cannot see -- a helper outside these modules that changes how
the fold behaves -- the recorded histories catch: ``tests/histories`` holds real
run logs with the state each folded to and the version it was recorded under, and
a fold that differs while the version did not fails there with what to do.
"""

from __future__ import annotations

import ast
import hashlib
import io
import tokenize
from functools import cache
from importlib import resources

PACKAGE = "es_agents.core"
ROOT = "fold"
LEFT_OUT = frozenset({"events"})  # see the module's docstring


def _source(module: str) -> str:
    return resources.files(PACKAGE).joinpath(f"{module}.py").read_text("utf-8")


def _imports(tree: ast.Module) -> set[str]:
    """The ``es_agents.core`` modules a module imports (at any depth of its code)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith(PACKAGE + "."):
                found.add(node.module.removeprefix(PACKAGE + ".").split(".")[0])
            elif node.module == PACKAGE:
                found.update(alias.name for alias in node.names)
    return found


def reducer_modules() -> tuple[str, ...]:
    """``fold`` and the core modules it reaches through imports, events left out."""
    seen: set[str] = set()
    todo = [ROOT]
    while todo:
        module = todo.pop()
        if module in seen or module in LEFT_OUT:
            continue
        seen.add(module)
        todo.extend(_imports(ast.parse(_source(module))))
    return tuple(sorted(seen))


def _offsets(source: str) -> list[int]:
    """Where each line starts in ``source`` (line numbers count from 1)."""
    starts = [0, 0]
    for line in io.StringIO(source):
        starts.append(starts[-1] + len(line))
    return starts


def rules_text(source: str) -> str:
    """``source`` without its comments and docstrings, each run of whitespace one
    space: what the code does, not how it is written down."""
    lines = _offsets(source)
    cut: list[tuple[int, int]] = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            (row, col), (end_row, end_col) = token.start, token.end
            cut.append((lines[row] + col, lines[end_row] + end_col))
    for node in ast.walk(ast.parse(source)):
        if isinstance(
            node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
        ):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
                and first.end_lineno is not None
                and first.end_col_offset is not None
            ):
                start = lines[first.lineno] + first.col_offset
                cut.append((start, lines[first.end_lineno] + first.end_col_offset))
    kept, at = [], 0
    for start, end in sorted(cut):
        kept.append(source[at:start])
        at = max(at, end)
    kept.append(source[at:])
    return " ".join("".join(kept).split())


def derive(texts: dict[str, str]) -> int:
    """The version of the rules in ``texts`` (module name -> source): 1..2**31-1."""
    digest = hashlib.sha256()
    for module in sorted(texts):
        digest.update(f"{module}\0{rules_text(texts[module])}\0".encode())
    return int(digest.hexdigest()[:8], 16) & 0x7FFFFFFF or 1


@cache
def reducer_version() -> int:
    """The running fold's version (derived once per process, ~30 ms: on first use,
    not at import)."""
    return derive({m: _source(m) for m in reducer_modules()})
