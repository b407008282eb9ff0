"""The report's plots of lines and points (apsat.pipeline.report_plots has the rest and
the rules they keep): e-graph growth over the saturation phases, a panel per target, and
kernels (or systolic cycles) against the ONNX node count, points named where names fit.
"""
from __future__ import annotations

import math

from apsat.pipeline.report_plots import (empty_figure, merged, new_figure, number, plot_labels, settle,
                                          short_name, styled, unique)

NAMED_LINES = 10            # growth plots name up to this many models (a light zoo: 9); more: grey lines, median
NAMED_POINTS = 12           # a scatter panel names at most this many points, the most unusual


# ---- e-graph growth: one panel per target ----------------------------------------------------------

def _phase_axis(order: list[str]) -> tuple[int, float]:
    """(rotation, inches a phase) of a phase-name axis: 30° for names up to 10 letters,
    spaced so that neighbouring labels' boxes stay apart; 90° for longer ones (a 90°
    label is as wide as a line of text, whatever its length)."""
    longest = max((len(p) for p in order), default=1)
    return (30, 0.1 + 0.055 * longest) if longest <= 10 else (90, 0.26)


@styled
def growth_figures(rows: list[dict]) -> list[tuple[str, object]]:
    """E-graph nodes after each saturation phase: one panel per target (its own phases);
    up to NAMED_LINES models as named lines, more as grey lines under their median."""
    what = "E-graph size after each saturation phase, one panel per target"
    data = [r for r in rows if any(number(p.get("nodes")) is not None for p in r.get("phases") or [])]
    if not data:
        return [(what, empty_figure("saturation phases"))]
    targets = unique(str(r.get("target")) for r in data)
    named = len(unique(str(r.get("model")) for r in data)) <= NAMED_LINES
    orders = {t: merged([str(p.get("phase")) for p in r.get("phases") or []]
                         for r in data if str(r.get("target")) == t) for t in targets}
    width = 1.0 + sum(max(2.6, _phase_axis(o)[1] * len(o) + 0.6) for o in orders.values())
    # the legend below: as many columns as its longest entry allows, the figure as much
    # taller as its rows need (nine long model names on one narrow panel overran the figure)
    entries = ([short_name(m) for m in unique(str(r.get("model")) for r in data)] if named
               else ["a model each", f"median of {len(data)} models"])
    ncol = max(1, min(len(entries), int((width - 0.2) // (0.06 * max(map(len, entries)) + 0.5))))
    fig, axes = new_figure(width, 3.3 + 0.17 * math.ceil(len(entries) / ncol), len(targets))
    colours = {m: f"C{i % 10}" for i, m in enumerate(unique(str(r.get("model")) for r in data))}
    for ax, target in zip(axes, targets):
        order = orders[target]
        lines = [(str(r.get("model")), [(order.index(str(p.get("phase"))), p["nodes"])
                                        for p in r.get("phases") or [] if number(p.get("nodes")) is not None])
                 for r in data if str(r.get("target")) == target]
        _growth_panel(ax, [(m, pts) for m, pts in lines if pts], named, colours)
        rotation = _phase_axis(order)[0]
        ax.set_xticks(range(len(order)), [short_name(p) for p in order], rotation=rotation, ha="right",
                      va="top" if rotation == 30 else "center", rotation_mode="anchor")
        ax.set_title(target)
        ax.set_xlabel("saturation phase")
    axes[0].set_ylabel("e-graph nodes after the phase")
    handles, names = axes[0].get_legend_handles_labels()
    for ax in axes[1:]:
        for h, n in zip(*ax.get_legend_handles_labels()):
            if n not in names:
                handles.append(h)
                names.append(n)
    fig.legend(handles, names, loc="outside lower center", ncol=ncol, frameon=False)
    return [(what, settle(fig))]


def _growth_panel(ax, lines: list[tuple[str, list]], named: bool, colours: dict) -> None:
    """One target's lines: named and coloured, or grey with the median of every phase."""
    for k, (model, pts) in enumerate(lines):
        xs, ys = zip(*pts)
        if named:
            ax.plot(xs, ys, marker="o", ms=3, color=colours[model], label=short_name(model))
        else:       # one legend entry for all the grey lines
            ax.plot(xs, ys, color="#8c959f", lw=0.6, alpha=0.5, label="_" if k else "a model each")
    if not named:
        by_x: dict[int, list] = {}
        for _, pts in lines:
            for x, y in pts:
                by_x.setdefault(x, []).append(y)
        xs = sorted(by_x)
        medians = [sorted(by_x[x])[len(by_x[x]) // 2] for x in xs]
        ax.plot(xs, medians, marker="o", ms=3, color="#0969da", lw=1.6,
                label=f"median of {len(lines)} models")
    ys = [y for _, pts in lines for _, y in pts]
    if ys and max(ys) / max(min(ys), 1) > 20:
        from matplotlib.ticker import FuncFormatter, NullFormatter

        ax.set_yscale("log")
        # 1,000 rather than 10³, and no labels between the decades (they crowd a short axis)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
        ax.yaxis.set_minor_formatter(NullFormatter())


# ---- kernels or cycles against ONNX nodes: points named where the names fit --------------------

@styled
def work_figures(rows: list[dict]) -> list[tuple[str, object]]:
    """GPU kernels (or systolic cycles) against the ONNX model's node count, log-log, a
    panel for each that the rows have; y = x (one kernel per ONNX node, onnxruntime's
    way) on the kernels panel. Points are named where the name overlaps no other
    (_name_points): all of a light zoo, the most unusual ones of a corpus."""
    what = "Kernels (or cycles) against the ONNX node count"
    panels = []
    for key, ylabel in (("kernels", "GPU kernels after optimisation"), ("cycles", "systolic cycles (modelled)")):
        mine = [r for r in rows if (number(r.get(key)) or 0) > 0 and (number(r.get("onnx_nodes")) or 0) > 0]
        if mine:        # named by model, with the target only where the panel has several
            panels.append((key, ylabel, [(lbl, r["onnx_nodes"], r[key]) for r, lbl in zip(mine, plot_labels(mine))]))
    if not panels:
        return [(what, empty_figure("kernel or cycle counts"))]
    fig, axes = new_figure(0.6 + 4.6 * len(panels), 4.8, len(panels))
    for ax, (key, ylabel, pts) in zip(axes, panels):
        _, xs, ys = zip(*pts)
        ax.scatter(xs, ys, s=14, color="#0969da", zorder=3)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("ONNX nodes (onnxruntime: about one kernel a node)")
        ax.set_ylabel(ylabel)
        if key == "kernels":
            lo, hi = min(xs + ys) * 0.8, max(xs + ys) * 1.25
            ax.plot([lo, hi], [lo, hi], color="#57606a", lw=0.8, ls="--", label="y = x: one kernel per ONNX node")
    if any(key == "kernels" for key, _, _ in panels):
        fig.legend(loc="outside upper center", frameon=False)
    settle(fig)                     # names are placed on the final layout, measured in pixels
    for ax, (_, _, pts) in zip(axes, panels):
        _name_points(ax, pts)
    return [(what, fig)]


def _name_points(ax, pts: list[tuple[str, float, float]]) -> None:
    """Name up to NAMED_POINTS points, each beside it (right or left, above or below)
    where the name stays in the axes and overlaps no name and no other point's marker;
    points furthest from the panel's median ratio first (they are the ones worth a name),
    the rest unnamed (the table has them). Names are measured before they are made (the
    renderer's text size, the point's pixel position): making and removing an artist per
    try was most of a corpus report's time."""
    from matplotlib.font_manager import FontProperties

    fig = ax.figure
    ax.autoscale_view()             # the limits the draw will use, before any pixel is computed
    renderer, font, px = fig.canvas.get_renderer(), FontProperties(size=6.5), fig.dpi / 72
    frame = ax.get_window_extent()
    ratios = sorted(math.log(y / x) for _, x, y in pts)
    median = ratios[len(ratios) // 2]
    marks = [tuple(ax.transData.transform((x, y))) for _, x, y in pts]
    taken: list[tuple[float, float, float, float]] = [(mx - 3, my - 3, mx + 3, my + 3) for mx, my in marks]
    named = 0
    for label, x, y in sorted(pts, key=lambda p: (-abs(math.log(p[2] / p[1]) - median), p[0])):
        if named == NAMED_POINTS:
            return
        w, h, _ = renderer.get_text_width_height_descent(label, font, ismath=False)
        cx, cy = ax.transData.transform((x, y))
        for dx, dy, ha in ((4, 2, "left"), (4, -9, "left"), (-4, 2, "right"), (-4, -9, "right")):
            x0 = cx + dx * px - (w if ha == "right" else 0.0)
            box = (x0 - 1, cy + dy * px - 1, x0 + w + 1, cy + dy * px + h + 1)   # 1 px of air
            inside = frame.x0 <= box[0] and box[2] <= frame.x1 and frame.y0 <= box[1] and box[3] <= frame.y1
            if inside and not any(box[0] < t[2] and t[0] < box[2] and box[1] < t[3] and t[1] < box[3]
                                  for t in taken):
                taken.append(box)
                named += 1
                ax.annotate(label, (x, y), xytext=(dx, dy), textcoords="offset points", fontsize=6.5,
                            ha=ha, va="bottom", annotation_clip=False).set_in_layout(False)
                break
