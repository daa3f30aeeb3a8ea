"""``txchaos bench compact`` repeats a run's close on a copy: the run folder stays as it was."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from harness.bench.compact import main, measure
from harness.ledger.schema import Kind
from harness.ledger.writer import LedgerWriter
from harness.verify import checker
from harness.verify.model import FlowContract


def _run(run: Path) -> Path:
    meta = {"run_id": run.name, "scenario": "bench", "seed": 1, "spec": {"contract": asdict(FlowContract())}}
    run.mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps(meta | {"complete": True}))
    with LedgerWriter(run / "ledger", "driver") as driver, LedgerWriter(run / "ledger", "worker-0") as worker:
        driver.emit(Kind.RUN_START, scenario="bench")
        for i in range(30):
            driver.emit(Kind.SUBMIT, op=f"op-{i:02d}", dest="orders")
            worker.emit(Kind.DELIVER, op=f"op-{i:02d}", msg=f"m{i}", attempt=1)
            worker.emit(Kind.EFFECT, op=f"op-{i:02d}", msg=f"m{i}", attempt=1 + (i == 7))
            if i == 7:  # applied twice
                worker.emit(Kind.EFFECT, op=f"op-{i:02d}", msg=f"m{i}", attempt=2)
        driver.emit(Kind.RUN_END, took_s=1.0)
    return run


def _listing(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in sorted(root.rglob("*"))}


def test_the_close_is_measured_on_a_copy_that_is_removed(tmp_path: Path) -> None:
    run = _run(tmp_path / "runs" / "r1")
    before = _listing(tmp_path)
    lines = sum(len(p.read_bytes().splitlines()) for p in (run / "ledger" / "segments").glob("*.jsonl"))
    row = measure(run)
    assert row[0] == "`r1`"
    assert row[1] == f"{lines:,}"  # every event in the segments reached the compacted ledger
    assert _listing(tmp_path) == before  # no events.parquet, no verdict, no scratch copy left
    assert row[-1] == checker.check_run(run, FlowContract()).headline()  # the copy was judged, not just compacted


def test_a_folder_without_segments_is_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit):
        main([str(tmp_path / "empty"), "--no-write"])
    assert "no ledger/segments" in capsys.readouterr().err
