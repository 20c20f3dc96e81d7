"""The fenced code blocks of a Markdown page, and how the docs tests run them.

A block is run when its language is python or bash. A Python block whose first line is a comment
naming a file (``# jobs.py``) is that file: it is written to the working directory and imported.
Every other block must be marked, on the line just before its fence, with
``<!-- not-run: why -->``: the tests fail on a block that is neither run nor marked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+|~~~+)(?P<lang>[\w+-]*)\s*$")
NOT_RUN = re.compile(r"^\s*<!--\s*not-run:\s*(?P<why>\S.*?)\s*-->\s*$")
FILE_LINE = re.compile(r"^# (?P<name>[A-Za-z_][\w]*\.py)\s*$")
RUN_LANGS = {"python", "bash"}


@dataclass(frozen=True)
class Block:
    page: str  # the page's path from the repository root
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    not_run: str | None  # the reason given by a not-run marker, None when unmarked

    @property
    def file_name(self) -> str | None:
        """``jobs.py`` for a Python block that is a file of that name, else None."""
        first = self.code.splitlines()[0] if self.code else ""
        m = FILE_LINE.match(first)
        return m.group("name") if self.lang == "python" and m else None

    @property
    def runs(self) -> bool:
        return self.not_run is None and self.lang in RUN_LANGS

    def __str__(self) -> str:
        return f"{self.page}:{self.line} ({self.lang or 'no language'})"


def blocks(page: str) -> list[Block]:
    """Every fenced block of ``page`` (a path from the repository root), in order."""
    lines = (ROOT / page).read_text().splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, fence = i, m.group("fence")
        j = i + 1
        while j < len(lines) and lines[j].strip() != fence:
            j += 1
        before = lines[start - 1] if start > 0 else ""
        marker = NOT_RUN.match(before)
        out.append(Block(page, start + 1, m.group("lang").lower(), "\n".join(lines[start + 1:j]),
                         marker.group("why") if marker else None))
        i = j + 1
    return out


def unaccounted(page: str) -> list[str]:
    """Blocks of ``page`` that are neither run by the tests nor marked as not run."""
    return [str(b) for b in blocks(page) if not b.runs and b.not_run is None]


PAGES = ("README.md", "docs/getting-started.md")
"""The pages whose examples tests/redis/test_docs_examples.py runs against a real Redis."""
