"""Plot a run: each operation's events over time with the fault windows, and the latency histogram.

The only module that imports matplotlib. It draws on an Agg canvas of its own and never touches
pyplot's global state, so plotting inside a pytest run needs no display and leaks no figures.
``soak_plots.py`` (the long run's throughput, latency and anomaly panels) draws through the
helpers here (``new_figure``, ``save_png``, ``empty_note``, ``panel_note``, ``shade_faults``)
and the ``Axes`` they hand out, so matplotlib stays owned by this one module.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.transforms import offset_copy

from harness.ledger.schema import Kind

__all__ = [
    "MAX_OPS",
    "Axes",
    "FaultWindow",
    "empty_note",
    "fault_windows",
    "new_figure",
    "order_ops",
    "panel_note",
    "plot_latency",
    "plot_timeline",
    "save_png",
    "shade_faults",
]

MAX_OPS = 60
DPI = 110
WIDTH_IN = 12.0


@dataclass(frozen=True)
class _Style:
    marker: str
    color: str
    size: float
    lane: float  # points above the op's row line, so events close in time do not hide each other
    hollow: bool = False


# Drawn in this order; the crash is drawn last and biggest because it is what the reader looks for.
_STYLES: dict[str, _Style] = {
    Kind.SUBMIT: _Style("o", "#7f7f7f", 24, 6.0, hollow=True),
    Kind.DELIVER: _Style(">", "#1f77b4", 24, 4.0),
    Kind.DB_COMMIT: _Style("s", "#2ca02c", 18, 2.0),
    Kind.BROKER_COMMIT: _Style("D", "#17becf", 16, 0.0),
    Kind.DOWNSTREAM: _Style("*", "#9467bd", 50, -2.0),
    Kind.DEAD_LETTER: _Style("v", "#8c564b", 30, -4.0),
    Kind.RESIDUE_QUEUE: _Style("P", "#ff7f0e", 30, -6.0),
    Kind.CRASH: _Style("X", "#d62728", 80, 0.0),
}
_FAULT_COLORS = ("#fdd0a2", "#c6dbef", "#d9d9d9", "#c7e9c0", "#dadaeb", "#fcbba1")
_HIGHLIGHT = "#c0392b"


@dataclass(frozen=True)
class FaultWindow:
    """A fault applied from ``start_ns`` to ``end_ns``; ``open`` when the ledger has no matching end."""

    point: str
    start_ns: int
    end_ns: int
    open: bool = False


def fault_windows(events: pa.Table) -> list[FaultWindow]:
    """Pair each ``fault_start`` with the next ``fault_end`` of the same ``point``, in time order.

    A start without an end lasts to the last event of the run (the fault was never healed, or the
    ledger stops before the healing was recorded); an end without a start begins at the first event.
    """
    if events.num_rows == 0:
        return []
    ts = events.column("ts_ns")
    first, last = pc.min(ts).as_py(), pc.max(ts).as_py()
    mask = pc.is_in(events.column("kind"), value_set=pa.array([Kind.FAULT_START.value, Kind.FAULT_END.value]))
    rows = events.filter(mask).sort_by("ts_ns").select(["ts_ns", "kind", "point"]).to_pylist()
    started: dict[str, list[int]] = {}
    windows: list[FaultWindow] = []
    for row in rows:
        point = row["point"] or "fault"
        if row["kind"] == Kind.FAULT_START:
            started.setdefault(point, []).append(row["ts_ns"])
        elif started.get(point):
            windows.append(FaultWindow(point, started[point].pop(0), row["ts_ns"]))
        else:
            windows.append(FaultWindow(point, first, row["ts_ns"]))
    for point, starts in started.items():
        windows.extend(FaultWindow(point, s, last, open=True) for s in starts)
    return sorted(windows, key=lambda w: (w.start_ns, w.point))


def order_ops(events: pa.Table, highlight: Iterable[str] | None = None, *, limit: int = MAX_OPS) -> list[str]:
    """Return the op ids to draw, top to bottom: highlighted ops first, each group by first event.

    >>> order_ops(table, highlight={"op-9"}, limit=3)
    ['op-9', 'op-1', 'op-2']
    """
    ops = events.filter(pc.is_valid(events.column("op")))
    if ops.num_rows == 0:
        return []
    firsts = ops.group_by("op").aggregate([("ts_ns", "min")]).sort_by([("ts_ns_min", "ascending"), ("op", "ascending")])
    ordered: list[str] = firsts.column("op").to_pylist()
    wanted = set(highlight or ())
    return ([op for op in ordered if op in wanted] + [op for op in ordered if op not in wanted])[:limit]


def _short(op: str, width: int = 26) -> str:
    return op if len(op) <= width else f"{op[: width // 2 - 1]}…{op[-(width // 2 - 1) :]}"


def new_figure(height_in: float, ratios: Sequence[float] = (1.0,)) -> tuple[Figure, list[Axes]]:
    """Return a figure on its own Agg canvas and one panel per entry of ``ratios`` (their relative
    heights), stacked and sharing the x axis, so a time axis lines up across panels."""
    fig = Figure(figsize=(WIDTH_IN, height_in), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    if len(ratios) == 1:
        return fig, [fig.add_subplot()]
    return fig, list(fig.subplots(len(ratios), 1, sharex=True, height_ratios=list(ratios)))


def save_png(fig: Figure, out: Path) -> Path:
    """Write ``fig`` as a PNG at ``out`` (its folder made if missing); return ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=DPI, format="png")
    return out


def empty_note(ax: Axes, message: str, *, shared_x: bool = False) -> None:
    """Write ``message`` in the middle of an empty panel and drop its ticks, so it reads as empty.

    ``shared_x``: the panel shares its x axis with others (``new_figure``); its x ticks stay, as
    dropping them would drop every panel's.
    """
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, color="#7f7f7f")
    if not shared_x:
        ax.set_xticks([])
    ax.set_yticks([])


def panel_note(ax: Axes, text: str) -> None:
    """Write ``text`` small and grey above the panel's left corner: what the panel counts."""
    ax.set_title(text, fontsize=9, color="#555555", loc="left")


def shade_faults(axes: Sequence[Axes], windows: Iterable[FaultWindow], secs: Callable[[int], float]) -> list[Any]:
    """Shade each fault window on every panel of ``axes``; return one legend handle per fault.

    One colour per fault point, so a fault applied again reads as the same fault. ``secs`` turns a
    timestamp into the x axis's seconds.
    """
    handles: list[Any] = []
    colors: dict[str, str] = {}
    for window in windows:
        color = colors.setdefault(window.point, _FAULT_COLORS[len(colors) % len(_FAULT_COLORS)])
        for ax in axes:
            ax.axvspan(secs(window.start_ns), secs(window.end_ns), color=color, alpha=0.45, lw=0, zorder=0)
        label = f"fault {window.point}" + (" (no end)" if window.open else "")
        if label not in {h.get_label() for h in handles}:
            handles.append(Patch(facecolor=color, alpha=0.45, label=label))
    return handles


def plot_timeline(
    events: pa.Table, out: Path, *, title: str, highlight: set[str] | None = None, broken: Sequence[str] = ()
) -> Path:
    """Write a PNG of each operation's events against seconds since the run's first event.

    At most ``MAX_OPS`` rows are drawn: the ``highlight`` ops (the anomalous ones) first, in red.
    ``broken`` lines (the broken invariants in words) are written under the title, in red.
    Crashes also get a faint vertical line, so a crash of an op not drawn still shows.
    """
    wanted = highlight or set()
    ops = order_ops(events, wanted)
    total = len(pc.unique(events.column("op")).drop_null()) if events.num_rows else 0
    fig, (ax,) = new_figure(min(16.0, max(3.4, 1.6 + 0.24 * len(ops))))
    fig.suptitle(title, fontsize=12, fontweight="bold")
    if events.num_rows == 0:
        empty_note(ax, "no events in the ledger")
        return save_png(fig, out)

    t0: int = pc.min(events.column("ts_ns")).as_py()

    def secs(ns: int) -> float:
        return (ns - t0) / 1e9

    handles = shade_faults([ax], fault_windows(events), secs)

    crash_ts = events.filter(pc.equal(events.column("kind"), Kind.CRASH.value)).column("ts_ns").to_pylist()
    for ns in crash_ts:
        ax.axvline(secs(ns), color=_STYLES[Kind.CRASH].color, lw=0.8, ls=":", alpha=0.5, zorder=1)

    row_of = {op: i for i, op in enumerate(ops)}
    shown = events.filter(
        pc.and_(
            pc.is_in(events.column("op"), value_set=pa.array(ops, pa.string())),
            pc.is_in(events.column("kind"), value_set=pa.array(list(_STYLES), pa.string())),
        )
    ).select(["ts_ns", "kind", "op"])
    rows = shown.to_pylist()

    spans: dict[str, tuple[float, float]] = {}
    for r in rows:
        x = secs(r["ts_ns"])
        lo, hi = spans.get(r["op"], (x, x))
        spans[r["op"]] = (min(lo, x), max(hi, x))
    for op, (lo, hi) in spans.items():
        ax.hlines(row_of[op], lo, hi, color="#bdbdbd", lw=0.8, zorder=2)
    for op in ops:
        if op in wanted:
            ax.axhspan(row_of[op] - 0.5, row_of[op] + 0.5, color=_HIGHLIGHT, alpha=0.07, lw=0, zorder=0)

    for kind, style in _STYLES.items():
        xs = [secs(r["ts_ns"]) for r in rows if r["kind"] == kind]
        ys = [row_of[r["op"]] for r in rows if r["kind"] == kind]
        face = "none" if style.hollow else style.color
        if xs:
            ax.scatter(
                xs,
                ys,
                marker=style.marker,
                s=style.size,
                facecolors=face,
                edgecolors=style.color,
                linewidths=1.0,
                zorder=4 if kind == Kind.CRASH else 3,
                # An offset in points, not data units: lanes stay a few pixels apart however many rows.
                transform=offset_copy(ax.transData, fig=fig, y=style.lane, units="points"),
            )
        handles.append(
            Line2D(
                [],
                [],
                ls="",
                marker=style.marker,
                markersize=7,
                markerfacecolor=face,
                markeredgecolor=style.color,
                label=kind.replace("_", " "),
            )
        )
    if crash_ts:
        handles.append(Line2D([], [], color=_STYLES[Kind.CRASH].color, ls=":", label="crash (any op)"))

    ax.set_yticks(range(len(ops)), [_short(op) for op in ops], fontsize=7 if len(ops) > 30 else 8)
    for tick, op in zip(ax.get_yticklabels(), ops, strict=True):
        if op in wanted:
            tick.set_color(_HIGHLIGHT)
            tick.set_fontweight("bold")
    ax.set_ylim(len(ops) - 0.5, -0.5)  # first op on top
    ax.set_xlim(left=0)
    ax.set_xlabel("seconds since the run's first event")
    ax.grid(axis="x", color="#eeeeee", lw=0.6)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    note = f"{len(ops)} of {total} operations"
    if wanted:
        note += f"; {len(wanted & set(ops))} anomalous first, in red"
    panel_note(ax, note)
    if broken:
        ax.set_title("\n".join(broken[:3]), fontsize=9, color=_HIGHLIGHT, loc="right")
    if not ops:
        empty_note(ax, "no event names an operation")
    fig.legend(handles=handles, loc="outside right upper", fontsize=8, frameon=False)
    return save_png(fig, out)


def _percentile(ordered: Sequence[float], p: float) -> float:
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def plot_latency(latencies_ms: list[float], out: Path, *, title: str) -> Path:
    """Write a PNG histogram of latencies with p50, p95 and p99 marked; log-scaled when tails are long."""
    fig, (ax,) = new_figure(4.2)
    fig.suptitle(title, fontsize=12, fontweight="bold")
    if not latencies_ms:
        empty_note(ax, "no latency samples")
        return save_png(fig, out)
    ordered = sorted(latencies_ms)
    n = len(ordered)
    lo, hi = ordered[0], ordered[-1]
    p50 = _percentile(ordered, 50)
    bins_n = min(80, max(20, round(2 * math.sqrt(n))))
    log_scale = lo > 0 and p50 > 0 and hi / p50 > 50  # a few retries or redeliveries dwarf the rest
    bins: Any = [lo * (hi / lo) ** (i / bins_n) for i in range(bins_n + 1)] if log_scale else bins_n
    ax.hist(ordered, bins=bins, color="#6baed6", edgecolor="white", lw=0.5)
    if log_scale:
        ax.set_xscale("log")
    for p, color in ((50, "#2ca02c"), (95, "#ff7f0e"), (99, "#d62728")):
        v = _percentile(ordered, p)
        ax.axvline(v, color=color, lw=1.2, ls="--", label=f"p{p} {v:,.1f} ms")
    panel_note(ax, f"{n} samples, max {hi:,.1f} ms")
    ax.set_xlabel("latency (ms)" + (", log scale" if log_scale else ""))
    ax.set_ylabel("operations")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.legend(loc="outside right upper", fontsize=8, frameon=False)
    return save_png(fig, out)


def render_run(run_dir: Path) -> Path | None:
    """Draw ``timeline.png`` and ``latency.png`` for a finished run folder; returns the timeline."""
    from harness.ledger.reader import read_ledger
    from harness.verify.verdict import Verdict

    verdict_path = run_dir / "verdict.json"
    if not verdict_path.exists():
        return None
    verdict = Verdict.load(verdict_path)
    events = read_ledger(run_dir / "ledger")
    title = f"{verdict.scenario} seed {verdict.seed}: {verdict.headline()}"
    highlight = {w.op for w in verdict.witnesses}
    out = plot_timeline(
        events, run_dir / "timeline.png", title=title, highlight=highlight, broken=verdict.broken_promises(3)
    )
    submit_ns: dict[str, int] = {}
    latencies: list[float] = []
    for op, kind, ts in zip(
        events["op"].to_pylist(), events["kind"].to_pylist(), events["ts_ns"].to_pylist(), strict=True
    ):
        if kind == Kind.SUBMIT and op is not None:
            submit_ns.setdefault(op, ts)
        elif kind == Kind.DOWNSTREAM and op in submit_ns:
            latencies.append((ts - submit_ns.pop(op)) / 1e6)
    if latencies:
        plot_latency(latencies, run_dir / "latency.png", title=f"{verdict.scenario}: submit to downstream")
    return out
