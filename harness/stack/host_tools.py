"""What the stack needs from the machine and its package managers: Java, Postgres, Maven's jars, Allure, a browser.

Each finds the tool or installs it (a Debian package when root, Maven, npm) and otherwise raises
a ``BootstrapError`` saying how to get it. Standard library only: the bootstrap runs before the
project's virtualenv exists.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import time
from pathlib import Path

from harness.paths import cache_root
from harness.stack.cache_manifest import intact, record
from harness.stack.install_shell import INSTALL, BootstrapError, apt_install, is_root, need, run, say, warn

MAVEN_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
JAVA_MIN = 17


def ensure_java() -> str:
    """Return the java executable after checking it is version 17 or newer."""
    java = need("java", "install a JDK 17+ (Debian: `apt-get install -y openjdk-17-jre-headless`)")
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False).stderr
    match = re.search(r'version "(\d+)', out)
    if not match or int(match.group(1)) < JAVA_MIN:
        found = out.splitlines()[0] if out else "unknown"
        raise BootstrapError(f"java is too old ({found}): install JDK 17+, then run {INSTALL} again")
    return java


def ensure_postgres() -> str:
    """Return the Postgres server bin directory, installing the Debian package if missing."""

    def find() -> Path | None:
        candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"), key=lambda p: int(p.parts[-3]))
        return candidates[-1].parent if candidates else None

    found = find()
    if found is None:
        apt_install("postgresql")
        found = find()
    if found is None:
        raise BootstrapError(
            f"postgres server binaries not found under /usr/lib/postgresql after installing the Debian package "
            f"postgresql: install it by hand, then run {INSTALL} again"
        )
    return str(found)


BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def ensure_browser() -> str | None:
    """Return a headless-capable Chromium for the report's browser test, installing Debian's when root.

    Only the checkout's test suite needs it (``./txchaos test``: ``--browser``); without root and
    without a browser the test skips, saying so, and nothing else is affected.
    """
    found = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    if found:
        return found
    if not is_root():
        warn("no chromium, the report's browser test will skip (run `sudo apt-get install -y chromium`)")
        return None
    apt_install("chromium")
    return shutil.which("chromium")


def digest(*paths: Path) -> str:
    """Return a short sha256 of the files' bytes: it names a cache folder per version of them."""
    h = hashlib.sha256()
    for p in paths:
        h.update(p.read_bytes())
    return h.hexdigest()[:12]


def ensure_jars(name: str, *, verify: bool = False) -> str:
    """Return a directory holding the runtime jars resolved from the shipped ``fixtures/jars/<name>/pom.xml``."""
    from harness import resources

    pom = resources.fixture("jars", name, "pom.xml")
    dest = cache_root() / "jars" / f"{name}-{digest(pom)}"
    if intact(f"{name} jars", dest, dest / ".complete", verify=verify):
        return str(dest)
    if not shutil.which("mvn"):
        apt_install("maven")
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    say(f"resolving the {name} jars with Maven (once, about a minute)...")
    run(
        [
            "mvn",
            "-B",
            "-q",
            "-f",
            str(pom),
            f"{MAVEN_DEPENDENCY_PLUGIN}:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={tmp}",
        ],
        what=f"resolving {name} jars with Maven",
    )
    (tmp / ".complete").write_text(time.strftime("%Y-%m-%dT%H:%M:%S"))
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    record(f"{name} jars", dest)
    return str(dest)


def ensure_allure(*, verify: bool = False) -> str | None:
    """Return the Allure command line, or None (with a warning) when npm is missing."""
    from harness.reporting.allure_cli import ALLURE_VERSION, MARKER_NAME
    from harness.reporting.allure_cli import ensure_allure as install

    root = cache_root()
    target = root / f"allure-{ALLURE_VERSION}"
    if intact("allure", target, target / MARKER_NAME, verify=verify):
        return str(install(root))  # in place: returns at once
    if not shutil.which("npm"):
        hint = f"Debian: `apt-get install -y npm`, then {INSTALL}"
        warn(f"npm missing, HTML reports off ({hint})")
        return None
    say(f"installing the Allure command line {ALLURE_VERSION} with npm (once, about a minute)...")
    exe = install(root)
    record("allure", target)
    return str(exe)
