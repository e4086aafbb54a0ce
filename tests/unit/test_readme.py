"""The README's Python examples run as written."""

import re
import textwrap
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_python_blocks_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
    assert blocks
    for block in blocks:
        code = textwrap.dedent(block)
        exec(compile(code, str(README), "exec"), {})  # noqa: S102 - our own README
