"""Reporting: timeline and latency plots, Allure attachments, and the offline HTML report."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from harness.errors import ConfigError
from harness.ledger.schema import ARROW_SCHEMA, COLUMNS, Kind, empty_row
from harness.reporting.allure import attach_file, attach_run, attach_verdict
from harness.reporting.allure_cli import ensure_allure, generate_html
from harness.reporting.plots import MAX_OPS, fault_windows, order_ops, plot_latency, plot_timeline
from harness.verify.verdict import Verdict, Witness

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
T0 = 1_700_000_000_000_000_000
NESTED_TEST = "test_tiny_allure_smoke"


def _table(events: list[tuple[float, str, str | None, str | None]]) -> pa.Table:
    """Build a ledger table from (seconds, kind, op, point) tuples."""
    rows: list[dict[str, Any]] = []
    for seq, (t, kind, op, point) in enumerate(events):
        row = empty_row()
        row.update(ts_ns=T0 + int(t * 1e9), src="worker-1", pid=4242, seq=seq, kind=kind, op=op, point=point)
        rows.append(row)
    return pa.Table.from_pydict({c: [r.get(c) for r in rows] for c in COLUMNS}, schema=ARROW_SCHEMA)


def _run_events() -> pa.Table:
    """Return a small run: three ops, a crash after the DB commit, one healed and one open fault."""
    events: list[tuple[float, str, str | None, str | None]] = [
        (0.0, Kind.RUN_START, None, None),
        (0.5, Kind.FAULT_START, None, "latency:broker"),
        (2.0, Kind.FAULT_END, None, "latency:broker"),
        (3.0, Kind.FAULT_START, None, "reset_peer:postgres"),
    ]
    for i, op in enumerate(("op-a", "op-b", "op-c")):
        t = 0.1 + i * 0.4
        events += [(t, Kind.SUBMIT, op, None), (t + 0.05, Kind.DELIVER, op, None)]
        if op == "op-b":
            events += [(t + 0.06, Kind.DB_COMMIT, op, None), (t + 0.07, Kind.CRASH, op, "after_db_commit")]
            t += 1.5
            events.append((t, Kind.DELIVER, op, None))
        events += [
            (t + 0.06, Kind.DB_COMMIT, op, None),
            (t + 0.07, Kind.BROKER_COMMIT, op, None),
            (t + 0.1, Kind.DOWNSTREAM, op, None),
        ]
    events += [(3.5, Kind.DEAD_LETTER, "op-d", None), (4.0, Kind.RESIDUE_QUEUE, "op-e", None)]
    events.append((4.2, Kind.RUN_END, None, None))
    return _table(events)


def _assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > 5 * 1024


def test_plot_timeline_writes_png(tmp_path: Path) -> None:
    out = plot_timeline(_run_events(), tmp_path / "timeline.png", title="crash after db commit", highlight={"op-b"})
    assert out == tmp_path / "timeline.png"
    _assert_png(out)


def test_plot_timeline_of_empty_ledger_still_writes_png(tmp_path: Path) -> None:
    _assert_png(plot_timeline(_run_events().slice(0, 0), tmp_path / "empty.png", title="nothing ran"))


def test_order_ops_by_first_event_with_highlighted_first() -> None:
    events = _run_events()
    assert order_ops(events) == ["op-a", "op-b", "op-c", "op-d", "op-e"]
    assert order_ops(events, {"op-e", "op-b", "op-missing"}) == ["op-b", "op-e", "op-a", "op-c", "op-d"]


def test_order_ops_keeps_highlighted_when_truncating() -> None:
    events = _table([(i * 0.01, Kind.SUBMIT, f"op-{i:03d}", None) for i in range(MAX_OPS + 20)])
    ops = order_ops(events, {"op-079", "op-070"})
    assert len(ops) == MAX_OPS
    assert ops[:3] == ["op-070", "op-079", "op-000"]


def test_fault_windows_pair_by_point_and_extend_an_open_one_to_the_last_event() -> None:
    windows = fault_windows(_run_events())
    assert [(w.point, w.start_ns - T0, w.end_ns - T0, w.open) for w in windows] == [
        ("latency:broker", 500_000_000, 2_000_000_000, False),
        ("reset_peer:postgres", 3_000_000_000, 4_200_000_000, True),
    ]


def test_plot_latency_writes_png(tmp_path: Path) -> None:
    latencies = [10.0 + (i % 17) * 1.5 for i in range(300)] + [5_000.0, 9_000.0]  # a long tail: log scale
    _assert_png(plot_latency(latencies, tmp_path / "latency.png", title="submit to downstream"))
    _assert_png(plot_latency([], tmp_path / "none.png", title="no samples"))


def _write_run(run_dir: Path) -> Path:
    """Write a run folder as the runner leaves it: verdict, manifest, timeline, service logs."""
    run_dir.mkdir(parents=True)
    witness = Witness(anomaly="duplicate-effect", op="op-b", msg_ids=("ID:1", "ID:2"), summary={"effect": 2})
    verdict = Verdict(
        anomalies={"duplicate-effect": 1},
        witnesses=(witness,),
        stats={"ops": 3, "events": 25},
        engine="inprocess",
        scenario="best-effort-1pc:naive",
        seed=1234,
        steps=("submit op-b", "crash after_db_commit"),
        faults=({"type": "crash", "name": "after_db_commit", "op": "op-b", "fired": True, "armed_ns": 1},),
    )
    verdict.write(run_dir / "verdict.json")
    (run_dir / "manifest.json").write_text(json.dumps({"scenario": "best-effort-1pc", "seed": 1234}))
    plot_timeline(_run_events(), run_dir / "timeline.png", title="best-effort-1pc", highlight={"op-b"})
    (run_dir / "logs").mkdir()
    (run_dir / "logs" / "activemq.log").write_text("INFO broker started\n")
    (run_dir / "logs" / "worker-1.log").write_text("x" * (600 * 1024) + "\nlast line\n")
    (run_dir / "logs" / "worker-2.log").write_text("")  # an empty attachment would open blank: skipped
    return run_dir


def test_attach_functions_are_noops_outside_allure(tmp_path: Path) -> None:
    run_dir = _write_run(tmp_path / "run")
    attach_run(run_dir)
    attach_verdict(run_dir / "verdict.json")
    attach_file(run_dir / "timeline.png", "timeline", "png")
    attach_file(run_dir / "missing.log", "missing", "log")
    attach_run(tmp_path / "no-such-run")


def test_attach_file_rejects_an_unknown_kind(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown attachment kind 'pdf'"):
        attach_file(tmp_path / "x.pdf", "x", "pdf")


def _nested_allure_run(tmp_path: Path) -> Path:
    """Run a trivial test file under pytest --alluredir that attaches a run; return the results dir."""
    run_dir = _write_run(tmp_path / "run")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # keep the nested run out of the project's config
    imports = "from pathlib import Path\nfrom harness.reporting.allure import attach_run\n"
    body = f"{imports}RUN = Path({str(run_dir)!r})\n"
    (tmp_path / "test_tiny.py").write_text(f"{body}\ndef {NESTED_TEST}():\n    attach_run(RUN)\n")
    # After the last test no test result is open: the attachments must be dropped, not raised.
    (tmp_path / "conftest.py").write_text(f"{body}\ndef pytest_sessionfinish():\n    attach_run(RUN)\n")
    results = tmp_path / "allure-results"
    # -p no:txchaos: the nested run needs none of the project's fixtures, only allure-pytest.
    cmd = [sys.executable, "-m", "pytest", "-p", "no:txchaos", "-p", "no:cacheprovider", "-q"]
    proc = subprocess.run(
        [*cmd, f"--alluredir={results}", "test_tiny.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return results


def test_attach_run_inside_allure_attaches_evidence_and_labels(tmp_path: Path) -> None:
    results = _nested_allure_run(tmp_path)
    (result,) = [json.loads(p.read_text()) for p in results.glob("*-result.json")]
    assert result["name"] == NESTED_TEST
    names = {a["name"]: a for a in result["attachments"]}
    assert set(names) == {
        "verdict.json",
        "verdict summary",
        "manifest.json",
        "timeline.png",
        "logs/activemq.log",
        "logs/worker-1.log",
    }
    assert names["timeline.png"]["type"] == "image/png"
    summary = (results / names["verdict summary"]["source"]).read_text()
    assert summary.startswith("ANOMALIES: duplicate-effect=1 [op-b]")
    assert "seed: 1234" in summary
    worker_log = (results / names["logs/worker-1.log"]["source"]).read_text()
    assert worker_log.startswith("[first ")
    assert worker_log.endswith("last line\n")
    labels = {(label["name"], label["value"]) for label in result["labels"]}
    assert {
        ("feature", "best-effort-1pc"),
        ("story", "naive"),
        ("tag", "crash:after_db_commit"),
        ("anomaly", "duplicate-effect"),
        ("severity", "critical"),
    } <= labels
    assert ("verdict", "ANOMALIES: duplicate-effect=1 [op-b]") in labels
    assert {"name": "seed", "value": "1234"}.items() <= result["parameters"][0].items()
    assert "txchaos run best-effort-1pc:naive --seed 1234" in result["description"]
    assert "faults fired: 1 of 1 requested" in result["description"]


def _report_text(index: Path) -> str:
    """Return index.html with the base64 data a single-file report embeds decoded and appended."""
    html = index.read_text()
    blobs = re.findall(r"d\('[^']+','([A-Za-z0-9+/=]+)'\)", html)
    return html + "".join(base64.b64decode(b).decode("utf-8", errors="replace") for b in blobs)


@pytest.mark.integration
def test_allure_cli_generates_an_offline_html_report(tmp_path: Path) -> None:
    if shutil.which("npm") is None or shutil.which("java") is None:
        pytest.skip("needs npm (to install allure-commandline) and Java (to run it)")
    cache = Path(os.environ.get("TXCHAOS_CACHE") or Path.home() / ".cache" / "txchaos")
    allure = ensure_allure(cache)
    assert allure.is_file()
    assert ensure_allure(cache) == allure  # the second call finds the marker and installs nothing

    index = generate_html(allure, _nested_allure_run(tmp_path), tmp_path / "report")
    assert index == tmp_path / "report" / "index.html"
    assert NESTED_TEST in _report_text(index)
    assert "googletagmanager" not in index.read_text()  # analytics off: nothing leaves the machine
