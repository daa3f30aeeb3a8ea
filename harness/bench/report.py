"""Record benchmark figures in ``docs/benchmarks.md``, one section per benchmark, replaced in place."""

from __future__ import annotations

import re
from pathlib import Path

# Developer-only: benchmarks are run from a checkout and write its docs/ (a wheel ships no docs/).
DOC = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"
HEADER = (
    "# Benchmarks\n\nFigures measured on the project's 2-core, 24 GiB machine. "
    "Each section names the command that\nreproduces it.\n"
)


def write_section(title: str, body: str, doc: Path = DOC) -> Path:
    """Replace (or append) the ``## title`` section of ``doc`` with ``body``."""
    text = doc.read_text() if doc.exists() else HEADER
    section = f"## {title}\n\n{body.strip()}\n"
    pattern = re.compile(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: section + "\n", text).rstrip() + "\n"
    else:
        text = text.rstrip() + "\n\n" + section
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)
    return doc


def table(headers: list[str], rows: list[list[object]]) -> str:
    """Return a Markdown table."""
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)
