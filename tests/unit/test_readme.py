"""The Python examples of the README and of every page of the documentation run as
written: here the ones that need nothing running; ``tests/integration/test_newcomer.py``
runs the README and the tutorials whole against the real stack."""

from pathlib import Path

import pytest

from tests.doc_blocks import DOCS, README, blocks, offline_python

PAGES = [README, *sorted(DOCS.rglob("*.md"))]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(README.parent)))
def test_python_blocks_that_need_nothing_run(page: Path) -> None:
    for block in offline_python(page):
        exec(compile(block.code, str(page), "exec"), {})  # noqa: S102 - our own pages


def test_the_readme_has_its_blocks_and_stays_short() -> None:
    assert len(README.read_text().splitlines()) <= 250
    found = blocks(README)
    assert [b.file for b in found if b.file] == ["my_agent.py"]
    assert any(b.lang == "bash" and "es-agents serve" in b.code for b in found)
    assert len(offline_python(README)) >= 2
