"""Install the Allure command line from npm into the cache, and turn allure-results into HTML.

Standard library only: the bootstrap imports this module before the project's virtualenv exists.

>>> allure = ensure_allure(Path.home() / ".cache" / "txchaos")
>>> generate_html(allure, Path("reports/allure-results"), Path("reports/allure-report"))
PosixPath('reports/allure-report/index.html')
"""

from __future__ import annotations

import fcntl
import functools
import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["ALLURE_NPM_PACKAGE", "ALLURE_VERSION", "ensure_allure", "generate_html", "supports_single_file"]

ALLURE_NPM_PACKAGE = "allure-commandline"
ALLURE_VERSION = "2.46.1"
MARKER_NAME = ".txchaos-installed"
INSTALL_TIMEOUT_S = 600.0
GENERATE_TIMEOUT_S = 300.0

log = logging.getLogger("txchaos.allure")


def _install_dir(cache_dir: Path) -> Path:
    return cache_dir / f"allure-{ALLURE_VERSION}"


def _executable(prefix: Path) -> Path:
    # The package bundles the Java distribution; its POSIX start script needs only `sh` and Java,
    # whereas node_modules/.bin/allure is a Node wrapper that spawns that same script.
    return prefix / "node_modules" / ALLURE_NPM_PACKAGE / "dist" / "bin" / "allure"


def _tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _fail(message: str, output: str, hint: str) -> RuntimeError:
    tail = f"\n--- last output lines ---\n{_tail(output)}" if output.strip() else ""
    return RuntimeError(f"{message}{tail}\nHint: {hint}")


def ensure_allure(cache_dir: Path) -> Path:
    """Return the ``allure`` executable under ``cache_dir``, installing it with npm when missing."""
    prefix = _install_dir(cache_dir)
    exe = _executable(prefix)
    marker = prefix / MARKER_NAME
    if marker.is_file() and exe.is_file():
        return exe
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError(
            f"npm not found: cannot install {ALLURE_NPM_PACKAGE}@{ALLURE_VERSION}\n"
            "Hint: install Node.js 18+ with npm (Debian: `apt-get install -y npm`)"
        )
    prefix.mkdir(parents=True, exist_ok=True)
    # Parallel sessions (xdist workers, two CI jobs) share the cache: one installs, the others wait.
    with (cache_dir / f".allure-{ALLURE_VERSION}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.is_file() and exe.is_file():
            return exe
        started = time.monotonic()
        spec = f"{ALLURE_NPM_PACKAGE}@{ALLURE_VERSION}"
        cmd = [npm, "install", "--no-audit", "--no-fund", "--prefix", str(prefix), spec]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired as exc:
            raise _fail(
                f"npm install {spec} timed out after {INSTALL_TIMEOUT_S:.0f} s",
                str(exc.stderr or ""),
                "check that the npm registry is reachable (`npm ping`) and retry",
            ) from exc
        if proc.returncode != 0:
            raise _fail(
                f"npm install {spec} failed (exit {proc.returncode})",
                proc.stderr or proc.stdout,
                f"check `npm ping` and the npm proxy settings, then rerun; delete {prefix} if the install is corrupt",
            )
        if not exe.is_file():
            raise _fail(
                f"{spec} installed but {exe} is missing",
                proc.stdout,
                f"delete {prefix} and rerun; the package layout may have changed",
            )
        seconds = time.monotonic() - started
        record = {"package": ALLURE_NPM_PACKAGE, "version": ALLURE_VERSION, "install_s": round(seconds, 2)}
        marker.write_text(json.dumps(record))
        log.info("installed %s@%s in %.1f s into %s", ALLURE_NPM_PACKAGE, ALLURE_VERSION, seconds, prefix)
    return exe


def _tool_env() -> dict[str, str]:
    if not os.environ.get("JAVA_HOME") and shutil.which("java") is None:
        raise RuntimeError(
            "Java not found: the Allure command line is a Java program\n"
            "Hint: install Java 17+ (Debian: `apt-get install -y openjdk-17-jre-headless`) or set JAVA_HOME"
        )
    # Without this, generation posts usage analytics (waiting up to 10 s when offline) and the report
    # embeds a remote analytics script: neither belongs in an offline report. Java reads it with
    # Boolean.parseBoolean, so it must be "true", not "1".
    return {**os.environ, "ALLURE_NO_ANALYTICS": "true"}


@functools.cache
def supports_single_file(allure: Path) -> bool:
    """Return whether this ``allure`` has ``generate --single-file`` (Allure 2.22 and later)."""
    proc = subprocess.run(
        [str(allure), "--help"], capture_output=True, text=True, timeout=60, env=_tool_env(), check=False
    )
    return "--single-file" in proc.stdout + proc.stderr


def generate_html(allure: Path, results_dir: Path, out_dir: Path) -> Path:
    """Write an HTML report of ``results_dir`` to ``out_dir`` and return its ``index.html``.

    The report is a single self-contained file when the tool supports it, so it opens from disk
    without a web server; older versions write the usual multi-file report. Either way
    ``out_dir/history`` holds the trend data the next report takes (``--history``).
    """
    if not results_dir.is_dir():
        raise RuntimeError(
            f"no allure results in {results_dir}\n"
            "Hint: run pytest with `--alluredir <dir>` first, and pass that directory"
        )
    cmd = [str(allure), "generate", str(results_dir), "-o", str(out_dir), "--clean"]
    if supports_single_file(allure):
        cmd.append("--single-file")
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=GENERATE_TIMEOUT_S, env=_tool_env(), check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise _fail(
            f"allure generate timed out after {GENERATE_TIMEOUT_S:.0f} s",
            str(exc.stderr or ""),
            f"look for very large attachments in {results_dir}",
        ) from exc
    index = out_dir / "index.html"
    if proc.returncode != 0 or not index.is_file():
        raise _fail(
            f"allure generate failed (exit {proc.returncode}) for {results_dir}",
            proc.stderr or proc.stdout,
            f"run `{' '.join(cmd)}` by hand to see the full output",
        )
    if "--single-file" in cmd:
        _keep_history(allure, results_dir, out_dir)
    return index


def _keep_history(allure: Path, results_dir: Path, out_dir: Path) -> None:
    """Write ``out_dir/history`` beside a single-file report, which has none of its own.

    The next report's trend graphs start from this folder (``allure_results.copy_history``);
    only the multi-file report writes it, so one is made aside for its history alone.
    """
    with tempfile.TemporaryDirectory(prefix="txchaos-allure-") as tmp:
        full = Path(tmp) / "report"
        cmd = [str(allure), "generate", str(results_dir), "-o", str(full), "--clean"]
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=GENERATE_TIMEOUT_S, env=_tool_env(), check=False
        )
        if proc.returncode != 0 or not (full / "history").is_dir():
            raise _fail(
                f"allure generate (for the history) failed (exit {proc.returncode}) for {results_dir}",
                proc.stderr or proc.stdout,
                f"run `{' '.join(cmd)}` by hand to see the full output",
            )
        shutil.rmtree(out_dir / "history", ignore_errors=True)
        shutil.copytree(full / "history", out_dir / "history")
