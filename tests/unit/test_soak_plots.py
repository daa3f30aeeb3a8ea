"""The soak run's plot: per-second aggregation, fault windows, anomaly placement, and the PNG."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from harness.ledger.reader import read_ledger
from harness.ledger.schema import ARROW_SCHEMA, COLUMNS, Kind, empty_row
from harness.ledger.synth import synth_run
from harness.reporting.plots import FaultWindow
from harness.reporting.soak_check import measure
from harness.reporting.soak_data import SoakSeries, per_second, soak_data
from harness.reporting.soak_plots import draw_soak, plot_soak

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
T0 = 1_700_000_000_000_000_000
MS = 1_000_000


def _ns(seconds: float) -> int:
    return T0 + round(seconds * 1e9)


def _ops(rows: list[tuple[float | None, float | None]]) -> pa.Table:
    """Build the per-operation table ``per_second`` reads from (submit s, completion s) pairs."""
    return pa.table(
        {
            "submit_ns": pa.array([None if s is None else _ns(s) for s, _ in rows], pa.int64()),
            "done_ns": pa.array([None if d is None else _ns(d) for _, d in rows], pa.int64()),
        }
    )


def _run(tmp_path: Path, events: list[tuple[float, str, str | None, str | None, str]]) -> Path:
    """Write a run folder whose ledger is the single-file layout of (s, kind, op, point, src) rows."""
    rows: list[dict[str, Any]] = []
    for seq, (t, kind, op, point, src) in enumerate(events):
        row = empty_row()
        row.update(ts_ns=_ns(t), src=src, pid=100, seq=seq, kind=kind, op=op, point=point)
        rows.append(row)
    table = pa.Table.from_pydict({c: [r.get(c) for r in rows] for c in COLUMNS}, schema=ARROW_SCHEMA)
    (tmp_path / "ledger").mkdir(parents=True)
    pq.write_table(table, tmp_path / "ledger" / "events.parquet")
    return tmp_path


def _assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert len(data) > 5 * 1024


def test_per_second_counts_and_nearest_rank_percentiles() -> None:
    series = per_second(
        _ops(
            [
                (0.1, 0.4),  # second 0: 300 ms
                (0.2, 2.3),  # second 2: 2100 ms
                (0.3, None),  # never completed: submitted only
                (0.5, 2.7),  # second 2: 2200 ms
                (1.2, 2.2),  # second 2: 1000 ms
                (2.05, 2.45),  # second 2: 400 ms
                (None, 2.9),  # completed without a submit: counted, no latency
                (3.9, 2.1),  # completed before its submit (skewed clocks): counted, no latency
            ]
        ),
        T0,
    )
    assert series.seconds == (0, 1, 2, 3)
    assert series.bucket_s == 1
    assert series.submitted == (4, 1, 1, 1)
    assert series.completed == (1, 0, 6, 0)
    # second 2 has the latencies 400, 1000, 2100, 2200: p50 is the 2nd (ceil(2)), p99 the 4th (ceil(3.96))
    assert series.p50_ms == pytest.approx((300.0, None, 1000.0, None))
    assert series.p99_ms == pytest.approx((300.0, None, 2200.0, None))
    assert series.skewed == 1


def test_per_second_counts_a_second_before_the_start_and_leaves_no_gap() -> None:
    series = per_second(_ops([(-0.5, 0.25), (4.0, 4.5)]), T0)
    assert series.seconds == (-1, 0, 1, 2, 3, 4)
    assert series.submitted == (1, 0, 0, 0, 0, 1)
    assert series.completed == (0, 1, 0, 0, 0, 1)
    assert series.p99_ms == pytest.approx((None, 750.0, None, None, None, 500.0))


def test_a_run_longer_than_max_buckets_seconds_gets_wider_buckets() -> None:
    series = per_second(_ops([(0.0, 1.0), (50_000.5, 50_000.9)]), T0)
    assert series.bucket_s == 3  # 50,001 seconds in at most 20,000 buckets
    assert (len(series.seconds), series.seconds[:2], series.seconds[-1]) == (16_667, (0, 3), 49_998)
    assert (series.submitted[0], series.submitted[-1], sum(series.submitted)) == (1, 1, 2)
    assert (series.completed[0], series.completed[-1], sum(series.completed)) == (1, 1, 2)
    assert (series.p99_ms[0], series.p99_ms[-1]) == pytest.approx((1000.0, 400.0))


def test_per_second_of_nothing_is_empty() -> None:
    assert per_second(_ops([(0.5, None)]), T0) == SoakSeries((0,), 1, (1,), (0,), (None,), (None,))
    assert per_second(_ops([]), T0) == SoakSeries((), 1, (), (), (), ())


def test_synth_ledger_plots_with_its_fault_windows_and_anomalies(tmp_path: Path) -> None:
    run = synth_run(tmp_path / "run", 30_000, seed=4, anomaly_rate=0.02)
    manifest = json.loads((run / "manifest.json").read_text())
    flagged = {cls: set(ops) for cls, ops in manifest["ground_truth_sample"].items() if ops}
    data = soak_data(run / "ledger", flagged)
    assert [(w.point, w.start_ns, w.end_ns) for w in data.windows] == [tuple(w) for w in manifest["fault_windows"]]
    assert data.completed_by == "downstream"
    assert {m.cls: m.count for m in data.anomalies} == {cls: len(ops) for cls, ops in flagged.items()}
    # every submitted op is counted once, in the second its first submit fell in
    events = read_ledger(run / "ledger")
    submits = events.filter(pc.equal(events["kind"], Kind.SUBMIT.value))
    assert sum(data.series.submitted) == len(pc.unique(submits["op"]))
    # a lost op never completes: its mark sits at its first event, its submit
    lost = submits.filter(pc.is_in(submits["op"], value_set=pa.array(sorted(flagged["lost"]))))
    firsts = lost.group_by("op").aggregate([("ts_ns", "min")])["ts_ns_min"].to_pylist()
    marks = next(m for m in data.anomalies if m.cls == "lost")
    assert marks.seconds == pytest.approx(sorted((t - data.t0_ns) / 1e9 for t in firsts), abs=1e-9)
    out = plot_soak(run, tmp_path / "soak.png", anomalies=flagged, title="synthetic soak")
    assert out == tmp_path / "soak.png"
    _assert_png(out)


def _small_run(tmp_path: Path, *, downstream: bool = True) -> Path:
    events: list[tuple[float, str, str | None, str | None, str]] = [
        (0.0, Kind.RUN_START, None, None, "driver"),
        (0.01, Kind.WORKER_START, None, None, "worker-1"),
        (0.02, Kind.WORKER_START, None, None, "worker-2"),
        (0.5, Kind.FAULT_START, None, "latency:activemq", "faults"),
        (1.0, Kind.SUBMIT, "op-a", None, "driver"),
        (1.1, Kind.DELIVER, "op-a", None, "worker-1"),
        (1.2, Kind.DB_COMMIT, "op-a", None, "worker-1"),
        (1.3, Kind.BROKER_COMMIT, "op-a", None, "worker-1"),
        (2.0, Kind.FAULT_END, None, "latency:activemq", "faults"),
        (3.2, Kind.SUBMIT, "op-b", None, "driver"),
        (3.3, Kind.DELIVER, "op-b", None, "worker-2"),
        (3.4, Kind.CRASH, "op-b", "before_db_commit", "worker-2"),
        (3.7, Kind.WORKER_EXIT, None, None, "driver"),  # the supervisor starts worker-2 again
        (3.75, Kind.WORKER_START, None, None, "worker-2"),
        (4.0, Kind.FAULT_START, None, "partition:kafka", "faults"),
        (5.0, Kind.RUN_END, None, None, "driver"),
        (9.0, Kind.RESIDUE_INVARIANT, "invariant:net-zero", None, "residue"),
    ]
    if downstream:
        events.append((2.5, Kind.DOWNSTREAM, "op-a", None, "sink"))
    return _run(tmp_path, events)


def test_small_ledger_places_anomalies_crashes_restarts_and_faults(tmp_path: Path) -> None:
    flagged = {"duplicate-output": {"op-a"}, "lost": {"op-b"}, "invariant-broken": {"invariant:net-zero"}}
    data = soak_data(_small_run(tmp_path) / "ledger", flagged)
    assert data.t0_ns == _ns(0.0)
    assert data.operations == 2
    assert data.series.seconds == (1, 2, 3)
    assert data.series.submitted == (1, 0, 1)
    assert data.series.completed == (0, 1, 0)  # op-a at its downstream, 2.5 s
    assert data.series.p50_ms == pytest.approx((None, 1500.0, None))
    marks = {m.cls: m for m in data.anomalies}
    assert [m.cls for m in data.anomalies] == ["lost", "duplicate-output", "invariant-broken"]  # the verdict's order
    assert marks["duplicate-output"].seconds == pytest.approx((2.5,))  # where it completed
    assert marks["lost"].seconds == pytest.approx((3.2,))  # never completed: its first event
    assert (marks["invariant-broken"].seconds, marks["invariant-broken"].unplaced) == ((), 1)
    resolution = (data.x_range[1] - data.x_range[0]) / 4000
    assert data.crashes.total == 1
    assert data.crashes.seconds == pytest.approx((3.4,), abs=resolution)
    # the supervisor's exit record, not worker-2's own start: a worker killed before it writes one
    # (its proxy cut) is restarted all the same
    assert data.restarts.total == 1
    assert data.restarts.seconds == pytest.approx((3.7,), abs=resolution)
    # the healed fault ends where the ledger says; the open one lasts to the ledger's last event
    assert data.windows == (
        FaultWindow("latency:activemq", _ns(0.5), _ns(2.0)),
        FaultWindow("partition:kafka", _ns(4.0), _ns(9.0), open=True),
    )
    _assert_png(plot_soak(tmp_path, tmp_path / "soak.png", anomalies=flagged, title="small"))


def test_flow_without_downstream_completes_at_the_last_commit(tmp_path: Path) -> None:
    data = soak_data(_small_run(tmp_path, downstream=False) / "ledger")
    assert data.completed_by == "commit"
    assert data.series.completed == (1, 0, 0)  # op-a's broker commit at 1.3 s
    assert data.series.p99_ms == pytest.approx((300.0, None, None))


@pytest.mark.parametrize("completed", [0, 1])
def test_tiny_ledger_draws_a_figure_saying_so(tmp_path: Path, completed: int) -> None:
    events: list[tuple[float, str, str | None, str | None, str]] = [(0.0, Kind.SUBMIT, "op-a", None, "driver")]
    if completed:
        events.append((0.2, Kind.DOWNSTREAM, "op-a", None, "sink"))
    data = soak_data(_run(tmp_path, events) / "ledger")
    assert sum(data.series.completed) == completed
    assert (data.windows, data.anomalies, data.crashes.total, data.restarts.total) == ((), (), 0, 0)
    _assert_png(plot_soak(tmp_path, tmp_path / "soak.png", title="tiny"))


def test_empty_ledger_draws_a_figure(tmp_path: Path) -> None:
    (tmp_path / "ledger" / "segments").mkdir(parents=True)
    data = soak_data(tmp_path / "ledger", {"lost": {"op-x"}})
    assert (data.operations, data.series.seconds, data.windows, data.anomalies) == (0, (), (), ())
    _assert_png(draw_soak(data, tmp_path / "soak.png", title="empty"))


def test_soak_check_measures_a_plot_in_a_child_process() -> None:
    numbers = measure(events=20_000, seed=2)
    assert numbers["events"] >= 19_000
    assert numbers["seconds"] > 0
    assert 0 < numbers["peak_rss_mb"] < 4096
    assert numbers["png_bytes"] > 5 * 1024


def test_the_legend_says_when_a_class_shows_only_the_verdicts_witnesses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A verdict names a sample of each class (its witnesses): a plot of them must not read as all of them."""
    import harness.reporting.soak_plots as plots

    legends: list[list[str]] = []

    def keep(fig: Any, out: Path) -> Path:
        legends.append([t.get_text() for legend in fig.legends for t in legend.get_texts()])
        return out

    monkeypatch.setattr(plots, "save_png", keep)
    flagged = {"duplicate-output": {"op-a"}, "lost": {"op-b"}}
    plot_soak(
        _small_run(tmp_path),
        tmp_path / "soak.png",
        anomalies=flagged,
        counts={"lost": 202, "duplicate-output": 1},
        title="t",
    )
    assert "lost (1 of 202: the verdict's witnesses)" in legends[0]
    assert "duplicate-output (1)" in legends[0]  # every one of them is marked


def test_a_step_the_flow_started_itself_is_no_submission_of_the_driver(tmp_path: Path) -> None:
    # A saga's step has its own events (the participant's) and a submit the close records after them:
    # counted as submitted at the close, it drew a spike there and "completed before their submission".
    run = _run(
        tmp_path,
        [
            (0.0, "run_start", None, None, "driver"),
            (0.1, "submit", "op-1", None, "driver"),
            (0.2, "deliver", "op-1", None, "orchestrator"),
            (0.3, "db_commit", "op-1", None, "orchestrator"),
            (0.4, "deliver", "op-1.pay", None, "payment"),
            (0.5, "db_commit", "op-1.pay", None, "payment"),
            (9.0, "submit", "op-1.pay", None, "driver"),  # recorded at the close, by="orchestrator"
        ],
    )
    data = soak_data(run / "ledger")
    assert (data.operations, data.by_flow) == (1, 1)
    assert sum(data.series.submitted) == 1
    assert sum(data.series.completed) == 1
    assert data.series.skewed == 0
    assert data.series.p99_ms[0] == pytest.approx(200.0)  # op-1: submitted at 0.1 s, last commit at 0.3 s
    draw_soak(data, tmp_path / "soak.png", title="steps")
    _assert_png(tmp_path / "soak.png")
