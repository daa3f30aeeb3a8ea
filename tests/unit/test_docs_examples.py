"""Every Python example in README.md and docs/ runs as written against the real API.

Each fenced ``python`` block is executed: imports resolve, specs, contracts and faults are built
and validated by their own constructors, handlers are defined. What needs a stack is given a
stand-in only where the block calls the pytest fixture (``txchaos_run``) or names a stack
(``endpoints``); a declared query's columns are held to the rule the harness applies before a
run (``verify/declared.py``), since a unit test has no database to run it on.
"""

from __future__ import annotations

import inspect
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

from harness import ScenarioSpec, Service
from harness.run.core.sink_parts import Messages
from harness.verify.declared import _check_columns, declarations
from harness.verify.model import FlowContract
from harness.verify.verdict import Verdict

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?:python|py)\n(?P<code>.*?)^(?P=indent)```", re.S | re.M)


def blocks() -> list[tuple[str, str]]:
    out = []
    for doc in DOCS:
        text = doc.read_text()
        for m in FENCE.finditer(text):
            line = text[: m.start()].count("\n") + 1
            out.append((f"{doc.relative_to(ROOT)}:{line}", textwrap.dedent(m.group("code"))))
    return out


def needs_stack(code: str) -> bool:
    """Tell whether a block acts on a running stack (its top level names ``endpoints``): integration runs it."""
    return bool({"endpoints", "ep"} & set(compile(code, "<doc>", "exec").co_names))


BLOCKS = blocks()
UNIT_BLOCKS = [(w, c) for w, c in BLOCKS if not needs_stack(c)]
STACK_BLOCKS = [(w, c) for w, c in BLOCKS if needs_stack(c)]


def select_columns(sql: str) -> list[str]:
    """Return the names the top-level SELECT list gives its columns (alias, or the bare column)."""
    body = re.split(r"(?i)\bselect\b", sql, maxsplit=1)[1]
    depth, items, cur = 0, [], ""
    for i, ch in enumerate(body):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0 and re.match(r"(?i)\s+from\b", body[i:]):
            break
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    items.append(cur)
    names = []
    for item in items:
        alias = re.search(r"(?i)\bas\s+(\w+)\s*$", item.strip())
        names.append(alias.group(1) if alias else item.strip().split(".")[-1])
    return names


class _Result:
    def __init__(self, spec: ScenarioSpec) -> None:
        assert isinstance(spec, ScenarioSpec), f"txchaos_run takes a ScenarioSpec, not {spec!r}"
        self.spec = spec
        self.verdict = Verdict({}, (), {}, "example", scenario=spec.label, seed=spec.seed)


def test_the_docs_hold_python_examples() -> None:
    assert len(BLOCKS) >= 12, [where for where, _ in BLOCKS]
    assert {w.split(":")[0] for w, _ in STACK_BLOCKS} == {"docs/architecture.md", "docs/faults.md", "docs/traps.md"}


def test_the_services_doc_says_the_amount_the_harness_sends() -> None:
    source = inspect.getsource(Messages.submit)
    (formula,) = re.findall(r'"amount": ([^,}]+)', source)
    doc = (ROOT / "docs" / "services.md").read_text()
    assert f'"amount": <{formula}>' in doc, f"docs/services.md must say the amount is {formula}"
    n = 10
    body = Service("x", command=("true",)).body_of("naive-s0-op00010", n, eval(formula, {"n": n}))
    assert f"`{body}`" in doc, f"docs/services.md's example body must read {body}"


@pytest.mark.parametrize(("where", "code"), UNIT_BLOCKS, ids=[w for w, _ in UNIT_BLOCKS])
def test_each_example_runs_as_written(where: str, code: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # examples that name files find them here, and write nothing in the repo
    # the files the examples name, relative to the working directory
    for name in ("schema.sql", "orders.sql", "services/orders/schema.sql"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("CREATE TABLE IF NOT EXISTS orders (op_id text, amount int);\n")
    (tmp_path / "orders-mats").mkdir()  # the Mats3 endpoint's source folder (docs/services.md)
    namespace: dict[str, Any] = {"__name__": "example", "txchaos_run": _Result, "__file__": str(tmp_path / "x.py")}
    exec(compile(code, where, "exec"), namespace)
    contracts = [v for v in namespace.values() if isinstance(v, FlowContract)]
    contracts += [v.contract for v in namespace.values() if isinstance(v, ScenarioSpec)]
    for contract in contracts:
        for decl in declarations(contract):
            names = select_columns(decl.sql)
            _check_columns(decl, names, [None] * len(names))
