"""Imports point one way, and each third-party driver is imported by exactly one adapter module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "harness"

# Third-party driver -> the one module allowed to import it.
ADAPTERS = {
    "stomp": {"harness/clients/activemq.py"},
    # The bare loops (harness/bench/bare_*) are the machine's limit measured *without* the harness:
    # they talk to the drivers themselves, on purpose, and nothing else imports them.
    "confluent_kafka": {"harness/clients/kafka/", "harness/bench/bare_kafka.py"},  # clients/kafka: a package
    "toxiproxy": {"harness/clients/toxiproxy.py"},
    "pyspark": {"harness/verify/spark/"},  # a package: session, job
    "duckdb": {"harness/verify/checker.py"},
    "allure": {"harness/reporting/allure.py"},
    "matplotlib": {"harness/reporting/plots.py"},
    "docker": {"harness/stack/docker.py"},
    "testcontainers": {"harness/stack/docker.py"},
    "psycopg": {"harness/bench/bare_loop.py"},  # else only through SQLAlchemy
}

# Layers, lowest first: a module may import only from its own layer or below.
LAYERS = [
    # reporting.allure_cli is a stdlib-only installer the bootstrap calls: it imports nothing of ours.
    # The bootstrap and the modules it is split into run before the virtualenv exists: stdlib only.
    {"errors", "heap", "interrupts", "jsontext", "paths", "poll", "procfs", "protocols", "resources", "signals"}
    | {"stack.topology"}
    | {"reporting.allure_cli", "stack.bootstrap", "stack.install_shell", "stack.cache_manifest", "stack.go_builds"}
    | {"stack.host_tools"},
    {"stack", "clients", "traps"},
    {"ledger", "worker", "patterns", "faults"},
    {"verify"},
    {"run", "machines", "soak"},
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


# Inside harness/run, lowest first: what a run is, then the brokers and processes it drives, then
# the lifecycle written once, then the flows that fill it in. ``harness.run`` itself registers them.
RUN_LAYERS = [{"spec"}, {"transports", "processes"}, {"core"}, {"flows"}]


def _run_layer(module: str) -> int:
    parts = module.split(".")
    if parts[:2] != ["harness", "run"]:
        return -1
    if len(parts) == 2:
        return len(RUN_LAYERS)  # the package: imports the flows to register them
    return next((i for i, layer in enumerate(RUN_LAYERS) if parts[2] in layer), -2)


def test_every_run_module_is_in_a_run_layer() -> None:
    loose = sorted({m for _, m, _ in _imports() if _run_layer(m) == -2})
    assert not loose, f"modules of harness/run in no layer of RUN_LAYERS: {loose}"


def test_run_layers_point_one_way() -> None:
    bad = [
        f"{rel} imports {name}"
        for rel, module, name in _imports()
        if _run_layer(module) >= 0 and _run_layer(name) > _run_layer(module)
    ]
    assert not bad, "upward imports inside harness/run:\n" + "\n".join(bad)


def _graph() -> dict[str, set[str]]:
    """Return module -> the harness modules it imports, anywhere in it (functions, TYPE_CHECKING too)."""
    modules = {
        str(p.relative_to(PKG.parent)).removesuffix(".py").replace("/", ".").removesuffix(".__init__")
        for p in PKG.rglob("*.py")
    }
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for path in PKG.rglob("*.py"):
        module = str(path.relative_to(PKG.parent)).removesuffix(".py").replace("/", ".").removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # ``from harness.run import flows`` imports the submodule, not only the package.
                names = [
                    f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                    for a in node.names
                ]
            else:
                continue
            # The public API's lazy table (harness/__init__.py) names everything by design.
            graph[module] |= {n for n in names if n in modules and n != module and module != "harness"}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Return the strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_no_import_circle_anywhere() -> None:
    circles = _circles(_graph())
    assert not circles, "import circles (local and TYPE_CHECKING imports count):\n" + "\n".join(map(str, circles))


def test_the_circle_check_finds_a_circle() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []
