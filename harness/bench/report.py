"""Record benchmark figures in ``docs/benchmarks.md``, one section per benchmark, replaced in place;
and the stack a benchmark runs on (``bench_stack``)."""

from __future__ import annotations

import argparse
import os
import platform
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from harness.stack.base import Endpoints
from harness.stack.selection import endpoints_from_env

# Developer-only: benchmarks are run from a checkout and write its docs/ (a wheel ships no docs/).
CHECKOUT = Path(__file__).resolve().parents[2]
DOC = CHECKOUT / "docs" / "benchmarks.md"
HEADER = (
    "# Benchmarks\n\nFigures measured on the project's 2-core, 24 GiB machine. "
    "Each section names the command that\nreproduces it.\n"
)


def bench_parser(name: str) -> argparse.ArgumentParser:
    """Return the parser of ``txchaos bench <name>``, with the ``--no-write`` flag every benchmark that records has."""
    parser = argparse.ArgumentParser(prog=f"txchaos bench {name}")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    return parser


def interpreter() -> str:
    """Return the line that says which Python and how many cores measured a section: the same
    harness ran a quarter faster on Debian's optimized build than on a default pyenv one."""
    where = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    python = f"{platform.python_implementation()} {platform.python_version()}"
    return f"Measured by {python} (`{where}`), {os.cpu_count()} cores."


def write_section(title: str, body: str, doc: Path = DOC) -> Path:
    """Replace (or append) the ``## title`` section of ``doc`` with ``body`` and the ``interpreter`` line."""
    text = doc.read_text() if doc.exists() else HEADER
    section = f"## {title}\n\n{body.strip()}\n\n{interpreter()}\n"
    pattern = re.compile(rf"^## {re.escape(title)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: section + "\n", text).rstrip() + "\n"
    else:
        text = text.rstrip() + "\n\n" + section
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)
    return doc


def write_measured(title: str, command: str, what: str, text: str) -> Path:
    """Write the ``## title`` section as the command that reproduces it, today's date, what it
    measures and its table."""
    return write_section(title, f"Command: `{command}` on {time.strftime('%Y-%m-%d')}.\n\n{what}\n\n{text}")


def table(headers: list[str], rows: list[list[object]]) -> str:
    """Return a Markdown table."""
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


@contextmanager
def bench_stack() -> Iterator[Endpoints]:
    """Yield the ``txchaos up`` stack ``$TXCHAOS_ENDPOINTS`` names, or a local stack of the benchmark's own."""
    given = endpoints_from_env()
    if given is not None:
        yield given
        return
    from harness.stack.local import LocalProvider

    provider = LocalProvider()
    try:
        yield provider.start()
    finally:
        provider.stop()
