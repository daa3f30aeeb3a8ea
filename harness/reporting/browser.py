"""Open a generated report in headless Chromium: its rendered DOM, and screenshots of its tabs.

Chromium is driven as a command (``--dump-dom``, ``--screenshot``), so no browser driver is
imported; the bootstrap installs Debian's ``chromium`` for the test suite (``--browser``).
Every flag keeps it off the network and out of the user's profile.

>>> html = dump_dom(find_chromium(), Path("reports/x/allure-report/index.html"), "categories")
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from harness.errors import ConfigError, HarnessError

__all__ = ["dump_dom", "find_chromium", "screenshot"]

NAMES = ("chromium", "chromium-browser", "google-chrome")
# Enough virtual time for Allure's single-file app to decode its data and draw its charts.
BUDGET_MS = 20_000
TIMEOUT_S = 120.0
# A loaded machine can end the budget before a chart is drawn; a page that is not ready is loaded again.
ATTEMPTS = 3


def find_chromium() -> Path:
    """Return the Chromium executable, or raise naming how to install it."""
    for name in NAMES:
        found = shutil.which(name)
        if found:
            return Path(found)
    raise ConfigError(
        "no Chromium found (looked for " + ", ".join(NAMES) + ")",
        hint="Debian: `apt-get install -y chromium` (the checkout's `./txchaos test` installs it when run as root)",
    )


def _run(chromium: Path, args: list[str], what: str) -> str:
    with tempfile.TemporaryDirectory(prefix="txchaos-chromium-") as profile:
        cmd = [
            str(chromium),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            f"--virtual-time-budget={BUDGET_MS}",
            *args,
        ]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired as exc:
            raise HarnessError(f"chromium {what} timed out after {TIMEOUT_S:.0f} s", hint="run it by hand") from exc
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-10:])
        raise HarnessError(f"chromium {what} failed (exit {proc.returncode}):\n{tail}", hint=" ".join(cmd))
    return proc.stdout


def _url(index: Path, tab: str) -> str:
    return index.resolve().as_uri() + (f"#{tab}" if tab else "")


def dump_dom(
    chromium: Path, index: Path, tab: str = "", *, ready: Callable[[str], bool] | None = None, what: str = ""
) -> str:
    """Return the DOM of ``index`` at tab ``tab`` (``""`` overview, ``categories``, ``graph``) once rendered.

    With ``ready``, the page is loaded again (at most ``ATTEMPTS`` times) until ``ready(dom)`` holds;
    if it never does, a HarnessError names ``what`` was missing.
    """
    for _ in range(ATTEMPTS):
        dom = _run(chromium, ["--dump-dom", _url(index, tab)], f"--dump-dom of {index}#{tab}")
        if ready is None or ready(dom):
            return dom
    raise HarnessError(
        f"{index}#{tab} rendered without {what or 'what was waited for'} in {ATTEMPTS} loads",
        hint=f"open it by hand: {_url(index, tab)}",
    )


def screenshot(chromium: Path, index: Path, tab: str, out: Path, *, size: tuple[int, int] = (1100, 700)) -> Path:
    """Write a PNG of ``index`` at tab ``tab`` to ``out`` and return it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    _run(chromium, [f"--screenshot={out}", f"--window-size={size[0]},{size[1]}", _url(index, tab)], f"screenshot {out}")
    if not out.is_file() or out.stat().st_size == 0:
        raise HarnessError(f"chromium wrote no screenshot to {out}", hint="run it by hand with --enable-logging")
    return out
