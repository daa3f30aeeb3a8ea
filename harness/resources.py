"""Find the files the harness ships: fixtures, the compose file, the built-in scenarios.

Standard library only (and ``harness.errors``, itself standard library only): the bootstrap, run
as a plain script before the virtualenv exists, reads the jar POMs through this module too.

Everything is read with ``importlib.resources`` from the ``harness._data`` package, so an
installed wheel and an editable checkout look the same (in a checkout the links in harness/_data
resolve to the root's folders, so paths name those). The files are handed to servers and to
``docker compose`` by path, so the package must sit in a folder (not a zip):
``data_root`` says so when it does not.

>>> fixture("sql", "onepc.sql").name
'onepc.sql'
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

from harness.errors import ConfigError

__all__ = ["compose_file", "data_root", "fixture", "fixtures_dir", "scenarios_dir"]

PACKAGE = "harness._data"


def data_root() -> Path:
    """Return the folder of ``harness._data`` (holding fixtures/, scenarios/, docker-compose.yml)."""
    root = importlib.resources.files(PACKAGE)
    if not isinstance(root, Path):
        raise ConfigError(
            f"txchaos is installed as {root!r}, not as a folder: servers read its fixtures as files",
            hint="install it with pip into a virtualenv (`pip install txchaos`), not as a zip or a zipapp",
        )
    return root


def fixtures_dir() -> Path:
    """Return the shipped ``fixtures/`` folder (broker configs, SQL, POMs, proxies, DTM config)."""
    return (data_root() / "fixtures").resolve()


def fixture(*parts: str) -> Path:
    """Return ``fixtures/<parts...>``; e.g. ``fixture("kafka", "server.properties")``."""
    return fixtures_dir().joinpath(*parts)


def compose_file() -> Path:
    """Return the shipped ``docker-compose.yml`` (its volumes name ``./fixtures/...`` beside it)."""
    return (data_root() / "docker-compose.yml").resolve()


def scenarios_dir() -> Path:
    """Return the folder of the built-in scenarios (``<name>_scenario.py``) that ``txchaos run`` resolves."""
    return (data_root() / "scenarios").resolve()
