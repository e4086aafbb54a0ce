"""The code blocks of a Markdown page, as the page gives them: the README and the
tutorials are run by the tests as they are written.

A block may be preceded by an HTML comment (invisible on the page):
``<!-- file: NAME -->`` (the reader is told to save it as NAME) or
``<!-- skip -->`` (it needs what a test has not: a model API, a browser, a terminal
left open). A Python block whose first line is ``# With the dev stack up`` needs the
stack and a served agent; other Python blocks run anywhere."""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
NEEDS_STACK = "# With the dev stack up"

_BLOCK = re.compile(
    r"(?:<!-- (?P<note>file: [\w./-]+|skip) -->\n)?```(?P<lang>\w*)\n(?P<code>.*?)```",
    re.DOTALL,
)


@dataclass(frozen=True)
class Block:
    lang: str
    code: str
    file: str | None  # "save this as"
    skip: bool

    @property
    def needs_stack(self) -> bool:
        return self.code.startswith(NEEDS_STACK)


def blocks(page: Path) -> list[Block]:
    out = []
    for m in _BLOCK.finditer(page.read_text()):
        note = m.group("note") or ""
        out.append(
            Block(
                m.group("lang"),
                textwrap.dedent(m.group("code")),
                note.removeprefix("file: ") if note.startswith("file: ") else None,
                note == "skip",
            )
        )
    return out


def offline_python(page: Path) -> list[Block]:
    """The Python blocks that need nothing running (nor saving)."""
    return [
        b
        for b in blocks(page)
        if b.lang == "python" and not b.skip and not b.needs_stack and not b.file
    ]


def shell_script(page: Path) -> str:
    """The page as one bash script: files saved where it says, shell blocks run in
    order, Python blocks that need the stack run with the virtualenv's python."""
    parts = []
    for b in blocks(page):
        if b.skip:
            continue
        if b.file:
            parts.append(
                f"cat > {b.file} <<'ES_AGENTS_PAGE_EOF'\n{b.code}ES_AGENTS_PAGE_EOF"
            )
        elif b.lang in ("bash", "sh"):
            parts.append(b.code)
        elif b.lang == "python" and b.needs_stack:
            parts.append(f"python - <<'ES_AGENTS_PAGE_EOF'\n{b.code}ES_AGENTS_PAGE_EOF")
    return "\n".join(parts)
