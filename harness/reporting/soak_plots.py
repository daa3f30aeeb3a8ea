"""Draw a soak run's report plot: throughput, latency and anomalies over time, faults shaded.

In the style of Jepsen's performance graphs: one PNG whose x axis is seconds since the run
started, three panels sharing it: the operations completed and submitted per second; the p50 and
p99 latency of the operations completed in each second; a strip with a row per anomaly class (a
mark per flagged operation) and rows of ticks for crashes and worker restarts. Each fault window
is shaded across the three panels, so a dip, a latency spike or a burst of anomalies reads
against the fault that caused it. The numbers come from ``soak_data.py``; the drawing goes
through ``plots.py``'s helpers, the one module that imports matplotlib.
"""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

from harness.reporting.plots import Axes, empty_note, new_figure, panel_note, save_png, shade_faults
from harness.reporting.soak_data import SoakData, soak_data
from harness.soak.driver import SoakResult
from harness.verify.model import ANOMALY_CLASSES

__all__ = ["draw_soak", "plot_soak"]

# One colour per class of ``ANOMALY_CLASSES`` (by position), so a class keeps its colour from run to run.
TITLE_CHARS = 70  # the title's line length: it shares the top of the figure with the legend
_CLASS_COLORS = (
    "#1f77b4",
    "#2ca02c",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#bcbd22",
    "#393b79",
    "#637939",
    "#8c6d31",
    "#7b4173",
    "#3182bd",
    "#31a354",
    "#756bb1",
)
_CRASH, _RESTART, _SUBMITTED, _COMPLETED = "#d62728", "#ff7f0e", "#7f7f7f", "#1f77b4"
_P50, _P99 = "#2ca02c", "#d62728"
_COMPLETED_BY = {
    "downstream": "at their first downstream message",
    "commit": "at their last commit (the ledger has no downstream message)",
}


def plot_soak(
    run_dir: Path,
    out: Path,
    *,
    anomalies: dict[str, set[str]] | None = None,
    counts: dict[str, int] | None = None,
    title: str,
) -> Path:
    """Write the soak plot of the run folder ``run_dir`` to the PNG ``out``; return ``out``.

    ``anomalies`` maps an anomaly class to the ids of the operations it flagged (a verdict's): each
    is marked where it completed, or where it started when it never did. ``counts``: each class's
    count in the verdict, which names only a sample (its witnesses): the legend says how many of
    them are marked. Reads the ledger in bounded memory (``soak_data``), so a million-operation run
    plots in seconds.
    """
    return draw_soak(soak_data(run_dir / "ledger", anomalies), out, title=title, counts=counts)


def render_soak(result: SoakResult) -> Path:
    """Draw a judged soak's ``soak.png`` into its folder, its flagged operations marked by class."""
    verdict = result.verdict
    flagged = {anomaly: verdict.ops(anomaly) for anomaly in verdict.found()}
    counts = verdict.found()
    return plot_soak(
        result.run_dir, result.run_dir / "soak.png", anomalies=flagged, counts=counts, title=result.soak.label
    )


def draw_soak(data: SoakData, out: Path, *, title: str, counts: dict[str, int] | None = None) -> Path:
    """Write the soak plot of ``data`` to the PNG ``out``; return ``out``. An empty run draws the
    three panels, each saying what it has nothing of."""
    strip_rows = len(data.anomalies) + (data.crashes.total > 0) + (data.restarts.total > 0)
    fig, (rates, latency, strip) = new_figure(7.0 + 0.15 * strip_rows, (3.0, 2.6, 0.6 + 0.2 * max(strip_rows, 1)))
    # Left-aligned and wrapped: centred, a long label ran under the legend at the top right.
    fig.suptitle("\n".join(textwrap.wrap(title, TITLE_CHARS)), x=0.01, ha="left", fontsize=12, fontweight="bold")

    def secs(ns: int) -> float:
        return (ns - data.t0_ns) / 1e9

    faults = shade_faults([rates, latency, strip], data.windows, secs)
    _draw_rates(rates, data)
    _draw_latency(latency, data)
    _draw_strip(strip, data, counts or {})
    rates.set_xlim(*data.x_range)
    strip.set_xlabel("seconds since the run started")
    for ax in (rates, latency, strip):
        ax.grid(axis="x", color="#eeeeee", lw=0.6)
        ax.set_axisbelow(True)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    handles: list[Any] = [h for ax in (rates, latency, strip) for h in ax.get_legend_handles_labels()[0]]
    if handles or faults:
        fig.legend(handles=handles + faults, loc="outside right upper", fontsize=8, frameon=False)
    return save_png(fig, out)


def _draw_rates(ax: Axes, data: SoakData) -> None:
    """Draw submissions and completions per second as steps (a bucket holds its whole second)."""
    s = data.series
    done, submitted = sum(s.completed), sum(s.submitted)
    if not s.seconds:
        empty_note(ax, "no operation was submitted or completed", shared_x=True)
        return
    edges = [*s.seconds, s.seconds[-1] + s.bucket_s]
    # completions drawn first and wide, submissions dashed over them: both show where they agree
    ax.stairs([n / s.bucket_s for n in s.completed], edges, color=_COMPLETED, lw=2.0, label=f"completed ({done:,})")
    ax.stairs(
        [n / s.bucket_s for n in s.submitted],
        edges,
        color=_SUBMITTED,
        lw=0.9,
        ls="--",
        label=f"submitted ({submitted:,})",
    )
    ax.set_ylim(bottom=0)
    ax.set_ylabel("operations / s" + (f"\n(mean over {s.bucket_s} s)" if s.bucket_s > 1 else ""))
    note = f"{done:,} of {data.operations:,} operations completed, {_COMPLETED_BY[data.completed_by]}"
    if done <= 1:
        note += ": too few for a rate"
    if data.by_flow:
        note += f"; {data.by_flow:,} steps the flow started itself left out"
    panel_note(ax, note)


def _draw_latency(ax: Axes, data: SoakData) -> None:
    """Draw the p50 and p99 latency of each second's completions (ms; log scale when all are > 0)."""
    s = data.series
    p99 = [v for v in s.p99_ms if v is not None]
    if not p99:
        empty_note(ax, "no operation completed after its submission: no latency to show", shared_x=True)
        return
    mids = [x + s.bucket_s / 2 for x in s.seconds]
    for values, color, name in ((s.p50_ms, _P50, "p50"), (s.p99_ms, _P99, "p99")):
        ys = [math.nan if v is None else v for v in values]
        ax.plot(mids, ys, color=color, lw=0.9, marker=".", ms=3, label=f"{name} latency")
    lows = [v for v in s.p50_ms if v is not None]
    if min(lows) > 0:
        ax.set_yscale("log")
    ax.set_ylabel("latency (ms)" + (", log" if min(lows) > 0 else ""))
    note = "submit to completion, by the second it completed"
    if s.skewed:
        note += f"; {s.skewed:,} completed before their submission by the clocks, left out"
    panel_note(ax, note)


def _class_color(cls: str, fallback: int) -> str:
    at = ANOMALY_CLASSES.index(cls) if cls in ANOMALY_CLASSES else len(ANOMALY_CLASSES) + fallback
    return _CLASS_COLORS[at % len(_CLASS_COLORS)]


def _draw_strip(ax: Axes, data: SoakData, counts: dict[str, int]) -> None:
    """Draw one row per anomaly class (a mark per flagged operation), then crash and restart ticks."""
    labels: list[str] = []
    for y, marks in enumerate(data.anomalies):
        extra = f", {marks.unplaced:,} with no event" if marks.unplaced else ""
        total = counts.get(marks.cls, 0)
        if total > marks.count:  # the verdict names a sample of the class: say the plot shows only it
            extra += f" of {total:,}: the verdict's witnesses"
        ax.scatter(
            marks.seconds,
            [y] * len(marks.seconds),
            marker="|",
            s=90,
            color=_class_color(marks.cls, y),
            label=f"{marks.cls} ({marks.count:,}{extra})",
        )
        labels.append(marks.cls)
    for ticks, name, color in ((data.crashes, "crash", _CRASH), (data.restarts, "worker restart", _RESTART)):
        if ticks.total:
            y = len(labels)
            ax.vlines(ticks.seconds, y - 0.35, y + 0.35, color=color, lw=0.7, label=f"{name} ({ticks.total:,})")
            labels.append(name)
    if not labels:
        empty_note(ax, "no anomaly flagged, no crash, no worker restart", shared_x=True)
        return
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylim(len(labels) - 0.5, -0.5)  # first class on top
