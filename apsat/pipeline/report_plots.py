"""The batch report's plots: matplotlib Figures, legible for one model or for a corpus.

`report_figures(rows)` draws them from batch rows (apsat.pipeline.batch.summary, with
"model" and "target"): apsat.pipeline.report_html inlines them in index.html as SVG, the
model-zoo notebook displays them. Each is a list of (caption, Figure), made without pyplot
(no backend is chosen or switched). What keeps them legible at 150 models, which
tests/pipeline/test_report_scale.py checks on the rendered figures:

- speed-ups get one panel per target, each with its own axis (logarithmic when its values
  span more than LOG_SPAN): on a shared axis, one target's large speed-ups would flatten
  another's small ones to nothing;
- models are rows of horizontal bars, ROW_INCHES a row, at most ROWS_PER_FIGURE rows a
  figure (more models: more figures, "models 51-100 of 150"), so tick labels never touch
  and no figure grows without bound;
- names are tick labels or legend entries, never free text over other text: phase names
  sit in a legend outside the axes or along an axis whose labels are rotated and spaced
  for their length; a scatter point is named only where its name overlaps no other
  (apsat.pipeline.report_points draws the growth lines and the scatter);
- the layout is settled (constrained) and then frozen, so what is measured is what is saved.
"""
from __future__ import annotations

import functools
import math

ROW_INCHES = 0.2            # a model's row: 7-pt tick labels with air between them
ROWS_PER_FIGURE = 50        # 50 rows: a figure about 11 inches high at most
LOG_SPAN = 10               # a panel whose largest speed-up is over 10x its smallest is logarithmic
LABEL_CHARS = 30            # model names cut to this in plots (the table has them whole)
BAR_REACH = 0.78            # the longest bar ends here (fraction of the axis), leaving room for its value
STYLE = {"font.size": 8, "axes.titlesize": 8, "xtick.labelsize": 7, "ytick.labelsize": 7,
         "legend.fontsize": 7, "axes.spines.top": False, "axes.spines.right": False}
OTHER = "other (untimed)"


def styled(draw):
    """Run a figure function under STYLE: matplotlib reads text sizes as each artist is
    made, so the whole drawing, not just the figure's creation, must be inside it."""
    @functools.wraps(draw)
    def run(*args, **kw):
        import matplotlib

        with matplotlib.rc_context(STYLE):
            return draw(*args, **kw)
    return run


def report_figures(rows: list[dict]) -> list[tuple[str, object]]:
    """Every plot of the report, as (caption, Figure): speed-ups, e-graph growth, seconds
    per phase, kernels (or cycles) against ONNX nodes. `rows` are finished models' rows; a
    plot with nothing to show says so."""
    from apsat.pipeline.report_points import growth_figures, work_figures

    return speedup_figures(rows) + growth_figures(rows) + time_figures(rows) + work_figures(rows)


# ---- helpers ---------------------------------------------------------------------------------------

def number(value):
    """`value` when it is a number (not a bool), else None."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def short_name(text, limit: int = LABEL_CHARS) -> str:
    """A name as a plot shows it: cut to `limit`, `$` escaped (it would start mathtext)."""
    text = str(text)
    text = text if len(text) <= limit else text[:limit - 1] + "…"
    return text.replace("$", r"\$")


def unique(items) -> list:
    """The items once each, in their first order."""
    return list(dict.fromkeys(items))


def plot_labels(rows: list[dict]) -> list[str]:
    """Each row's name in a plot: the model, with its target when the rows have several."""
    several = len({r.get("target") for r in rows}) > 1
    # a long name is cut, its target kept whole: rows of two targets stay told apart
    return [short_name(r.get("model", "?"), LABEL_CHARS - len(str(r.get("target"))) - 3) + f" ({r.get('target')})"
            if several else short_name(r.get("model", "?")) for r in rows]


def new_figure(width: float, height: float, ncols: int = 1, **kw):
    """A pyplot-free Figure with constrained layout and a row of `ncols` axes (a list).
    Its canvas is Agg's, whose renderer measures text (_name_points); saving as SVG or PNG
    works as ever."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, list(fig.subplots(1, ncols, squeeze=False, **kw)[0])


def settle(fig):
    """Lay the figure out once and freeze it: saving (or measuring) it later moves nothing.
    Only the layout engine runs (it measures every text), not a whole draw: a draw here
    was most of the time a 150-model report took to make."""
    fig.get_layout_engine().execute(fig)
    fig.set_layout_engine("none")
    return fig


def empty_figure(what: str) -> object:
    """A small figure that says there is no `what` to plot (every row failed, say)."""
    fig, (ax,) = new_figure(6.4, 1.6)
    ax.text(0.5, 0.5, f"no {what} to plot", ha="center", va="center", transform=ax.transAxes,
            color="#57606a")
    ax.set_xticks([])
    ax.set_yticks([])
    return settle(fig)


def _pages(n: int) -> list[range]:
    """Row ranges of the figures for n models: ROWS_PER_FIGURE each, the same size as near
    as can be (150 models: three of 50; 51: 26 and 25, not 50 and 1)."""
    count = max(1, math.ceil(n / ROWS_PER_FIGURE))
    size = math.ceil(n / count)
    return [range(i, min(i + size, n)) for i in range(0, n, size)] or [range(0)]


def _caption(what: str, page: range, n: int, pages: int, noun: str = "models") -> str:
    """A figure's caption: `what`, and which rows it holds when there are several pages."""
    return what if pages == 1 else f"{what} ({noun} {page.start + 1}–{page.stop} of {n})"


def _rows_height(n: int, extra: float = 0.0) -> float:
    """Figure height for n bar rows: ROW_INCHES each plus the axis, title and legend room."""
    return 1.0 + extra + ROW_INCHES * max(n, 3)


# ---- speed-ups: one panel per target -----------------------------------------------------------

def _axis_range(values: list[float]) -> tuple[bool, float, float]:
    """(log, left, right) of a speed-up axis: logarithmic when the values span more than
    LOG_SPAN, its left end then half the smallest value (the shortest bar keeps a visible
    length, and 1x, where no bar would show on a log axis starting at 1, stays a bar);
    the longest bar ends at BAR_REACH of the axis."""
    lo_v, hi_v = min(values), max(max(values), 1.0)
    if hi_v / lo_v > LOG_SPAN:
        left = lo_v / 2
        return True, left, math.exp(math.log(left) + (math.log(hi_v) - math.log(left)) / BAR_REACH)
    return False, 0.0, hi_v / BAR_REACH


def _times(v: float) -> str:
    """A speed-up as its bar's label: three significant figures at most (855×, 48.9×, 2.33×)."""
    return f"{v:.0f}×" if v >= 100 else f"{v:.1f}×" if v >= 10 else f"{v:.2f}×"


@styled
def speedup_figures(rows: list[dict]) -> list[tuple[str, object]]:
    """Modelled speed-up per model: one panel per target side by side, models as rows
    shared by the panels, each panel with its own axis (_axis_range, the same on every
    page), the value at each bar's end, a dashed line at 1x."""
    what = "Modelled speed-up per model, one panel per target"
    data = [r for r in rows if (number(r.get("speedup")) or 0) > 0]
    if not data:
        return [(what, empty_figure("speed-ups"))]
    targets = unique(str(r.get("target")) for r in data)
    models = unique(str(r.get("model")) for r in data)
    value = {(str(r.get("model")), str(r.get("target"))): float(r["speedup"]) for r in data}
    axis = {t: _axis_range([v for (_, tt), v in value.items() if tt == t]) for t in targets}
    out = []
    for page in (pages := _pages(len(models))):
        names = [models[i] for i in page]
        fig, axes = new_figure(1.9 + 2.9 * len(targets), _rows_height(len(names)), len(targets), sharey=True)
        for ax, target in zip(axes, targets):
            _speedup_panel(ax, [value.get((m, target)) for m in names], target, axis[target])
        axes[0].set_yticks(range(len(names)), [short_name(m) for m in names])
        axes[0].set_ylim(len(names) - 0.5, -0.5)          # first model on top, on every panel
        out.append((_caption(what, page, len(models), len(pages)), settle(fig)))
    return out


def _speedup_panel(ax, values: list, target: str, axis: tuple[bool, float, float]) -> None:
    """One target's bars; a model without a result for it gets an en dash, not a bar."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    log, left, right = axis
    if log:
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))    # 100, not 10²
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlim(left, right)
    ax.set_title(target)
    ax.set_xlabel("speed-up (×, log scale)" if log else "speed-up (×)")
    rows = [(i, v) for i, v in enumerate(values) if v is not None]
    if rows:            # bars start at the axis' left end (0, or half the smallest on a log axis)
        ax.barh([i for i, _ in rows], [v - left for _, v in rows], left=left, height=0.7, color="#0969da")
    for i, v in enumerate(values):
        ax.text(left if v is None else v, i, " –" if v is None else " " + _times(v), va="center",
                fontsize=7, color="#57606a" if v is None else "#1f2328")
    if left < 1.0 < right:
        ax.axvline(1.0, color="#57606a", lw=0.8, ls="--")


# ---- seconds per phase: stacked bars, phases in a legend ---------------------------------------

def merged(sequences) -> list[str]:
    """Names of several ordered sequences merged, each after its predecessor in its own
    sequence (a row's phases are in pipeline order; rows of other targets add theirs)."""
    order: list[str] = []
    for seq in sequences:
        prev = None
        for name in seq:
            if name not in order:
                order.insert(order.index(prev) + 1 if prev in order else len(order), name)
            prev = name
    return order


def _with_other(row: dict) -> dict:
    """The row's phase seconds, plus OTHER when its total exceeds their sum by more than
    2% (and 0.05 s): rows stored by an older apsat timed only optimize's phases, and a bar
    should be as long as the model took."""
    phases = {k: float(v) for k, v in (row.get("phase_seconds") or {}).items() if number(v) is not None}
    rest = (number(row.get("seconds")) or 0.0) - sum(phases.values())
    return {**phases, OTHER: rest} if rest > max(0.05, 0.02 * sum(phases.values())) else phases


def _colours(phases: list[str]) -> dict:
    """A colour a phase, the same on every page: tab20's strong tones first, then its light
    ones; OTHER grey."""
    from matplotlib import colormaps

    tab20 = colormaps["tab20"]
    picks = [tab20(i) for i in list(range(0, 20, 2)) + list(range(1, 20, 2))]
    named = [p for p in phases if p != OTHER]
    return {**{p: picks[i % 20] for i, p in enumerate(named)}, OTHER: "#d0d7de"}


@styled
def time_figures(rows: list[dict]) -> list[tuple[str, object]]:
    """Seconds per pipeline phase, a stacked bar a model (its length the model's total
    time), phase names in a legend above the bars; the same axis on every page."""
    from matplotlib.patches import Patch

    what = "Seconds per pipeline phase"
    data = [(label, _with_other(r)) for r, label in zip(rows, plot_labels(rows)) if r.get("phase_seconds")]
    if not data:
        return [(what, empty_figure("phase timings"))]
    phases = merged(list(s) for _, s in data)
    phases = [p for p in phases if p != OTHER] + ([OTHER] if OTHER in phases else [])
    colour = _colours(phases)
    right = max(sum(s.values()) for _, s in data) * 1.02 or 1.0
    ncol = min(len(phases), 5)
    legend_rows = math.ceil(len(phases) / ncol)
    noun = "models" if len({r.get("target") for r in rows}) == 1 else "model-target rows"
    out = []
    for page in (pages := _pages(len(data))):
        part = [data[i] for i in page]
        fig, (ax,) = new_figure(6.4, _rows_height(len(part), 0.18 * legend_rows))
        _stacked_bars(ax, [s for _, s in part], phases, colour)
        ax.set_yticks(range(len(part)), [label for label, _ in part])
        ax.set_ylim(len(part) - 0.5, -0.5)
        ax.set_xlim(0, right)
        ax.set_xlabel("seconds (each bar: the model's whole run)")
        fig.legend(handles=[Patch(color=colour[p], label=p) for p in phases], loc="outside upper center",
                   ncol=ncol, frameon=False, handlelength=1.2, columnspacing=1.0)
        out.append((_caption(what, page, len(data), len(pages), noun), settle(fig)))
    return out


def _stacked_bars(ax, seconds: list[dict], phases: list[str], colour: dict) -> None:
    """A stacked bar a row, drawn as one PolyCollection a phase: a Rectangle artist per
    segment (barh) made a 150-model report several times slower to draw."""
    from matplotlib.collections import PolyCollection

    left = [0.0] * len(seconds)
    for phase in phases:
        boxes = []
        for i, s in enumerate(seconds):
            w = s.get(phase, 0.0)
            if w > 0:
                x = left[i]
                boxes.append([(x, i - 0.35), (x + w, i - 0.35), (x + w, i + 0.35), (x, i + 0.35)])
                left[i] += w
        ax.add_collection(PolyCollection(boxes, facecolors=[colour[phase]], edgecolors="none"))
