"""The README's Python examples run as written: here the ones that need nothing
running; ``tests/integration/test_readme_stack.py`` runs the ones that need the dev
stack (they say so on their first line)."""

import re
import textwrap
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
NEEDS_STACK = "# With the dev stack up"


def python_blocks() -> list[str]:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    return [textwrap.dedent(b) for b in blocks]


def test_readme_python_blocks_run() -> None:
    offline = [b for b in python_blocks() if not b.startswith(NEEDS_STACK)]
    assert len(offline) >= 3
    for code in offline:
        exec(compile(code, str(README), "exec"), {})  # noqa: S102 - our own README
