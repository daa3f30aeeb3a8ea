"""Imports point one way, and each third-party driver is imported by exactly one adapter module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "harness"

# Third-party driver -> the one module allowed to import it.
ADAPTERS = {
    "stomp": {"harness/clients/activemq.py"},
    "confluent_kafka": {"harness/clients/kafka/"},  # a package: admin, group, reader, records
    "toxiproxy": {"harness/clients/toxiproxy.py"},
    "pyspark": {"harness/verify/spark/"},  # a package: session, job
    "duckdb": {"harness/verify/checker.py"},
    "allure": {"harness/reporting/allure.py"},
    "matplotlib": {"harness/reporting/plots.py"},
    "docker": {"harness/stack/docker.py"},
    "testcontainers": {"harness/stack/docker.py"},
    "psycopg": set(),  # only through SQLAlchemy
}

# Layers, lowest first: a module may import only from its own layer or below.
LAYERS = [
    # reporting.allure_cli is a stdlib-only installer the bootstrap calls: it imports nothing of ours.
    {"errors", "paths", "resources", "stack.bootstrap", "stack.topology", "reporting.allure_cli"},
    {"stack", "clients", "traps"},
    {"ledger", "worker", "patterns", "faults"},
    {"verify"},
    {"run", "machines"},
    {"reporting", "bench"},
    {"cli", "pytest_plugin"},
]


def _layer(module: str) -> int:
    parts = module.split(".")[1:]
    for depth in (2, 1):
        key = ".".join(parts[:depth])
        for i, layer in enumerate(LAYERS):
            if key in layer:
                return i
    return -1


def _imports() -> list[tuple[str, str, str]]:
    out = []
    for path in PKG.rglob("*.py"):
        rel = str(path.relative_to(PKG.parent))
        module = rel.removesuffix(".py").replace("/", ".").removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                out += [(rel, module, a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                out.append((rel, module, node.module))
    return out


@pytest.mark.parametrize("driver", sorted(ADAPTERS))
def test_driver_imported_only_by_its_adapter(driver: str) -> None:
    users = {rel for rel, _, name in _imports() if name == driver or name.startswith(driver + ".")}
    # An adapter ending in "/" is a package: every module in it may import the driver.
    outside = {u for u in users if not any(u == a or (a.endswith("/") and u.startswith(a)) for a in ADAPTERS[driver])}
    assert not outside, f"{driver} imported outside its adapter: {sorted(outside)}"


def test_every_module_has_a_layer() -> None:
    # A module in no layer escapes the one-way rule silently (harness.resources did).
    loose = sorted({module for _, module, _ in _imports() if module != "harness" and _layer(module) < 0})
    assert not loose, f"modules in no layer of LAYERS: {loose}"


def test_imports_point_one_way() -> None:
    bad = []
    for rel, module, name in _imports():
        if not name.startswith("harness.") or module == "harness":
            continue
        src, dst = _layer(module), _layer(name)
        if src >= 0 and dst > src:
            bad.append(f"{rel} imports {name}")
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_bootstrap_siblings_do_not_shadow_stdlib() -> None:
    # bootstrap.py runs as a script before the venv exists; its folder is then sys.path[0].
    import sys

    siblings = {p.stem for p in (PKG / "stack").glob("*.py")}
    assert not siblings & set(sys.stdlib_module_names)
