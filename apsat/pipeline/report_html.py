"""The batch report a person reads: one self-contained `index.html` (apsat.pipeline.batch rows).

`write_report` writes a header (title, targets, when, how many models ended how, the wall
time), a table of every model (sortable by clicking a column header: a few lines of inline
JavaScript) and four plots drawn by matplotlib and inlined as SVG: the modelled speed-up per
model, the e-graph's growth over the saturation phases, the time per pipeline phase, and the
kernels (or systolic cycles) against the ONNX model's node count. Nothing is fetched from
elsewhere: no external script, style sheet, font or image. Every text from a row (model
names, error messages: they come from users' files) is escaped. Rows without figures (a
failed or interrupted model) appear in the table with their reason and are left out of the
plots. matplotlib is imported only here, when a report is written.
"""
from __future__ import annotations

import html
import io
import re
import time
from pathlib import Path
from urllib.parse import quote

from apsat.errors import ApsatError

STATUS_COLOURS = {"ok": "#1a7f37", "mismatch": "#cf222e", "error": "#cf222e", "failed": "#cf222e",
                  "reused": "#0969da", "interrupted": "#9a6700"}
_DONE = ("ok", "mismatch", "reused")


def write_report(rows: list[dict], out_dir, title: str = "apsat zoo", meta: dict | None = None) -> Path:
    """Write `out_dir/index.html` from batch rows (see apsat.pipeline.batch.summary) and
    return its path. `meta` may hold "target", "when" (text; default: now), "wall_seconds"
    (the batch's wall time) and any other key, shown as given in the header. A model's
    name links to `MODEL/report.json` when that file exists under `out_dir`. Raises
    ApsatError when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        raise ApsatError("the HTML report needs matplotlib: pip install matplotlib") from None
    del matplotlib
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = [r for r in rows if isinstance(r, dict)]
    labels = _labels(rows)
    plots = _plots(rows, labels)
    page = _page(title, _header(title, rows, dict(meta or {})), _table(rows, labels, out), plots)
    path = out / "index.html"
    tmp = out / ".index.html.tmp"
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(path)
    return path


# ---- text helpers ------------------------------------------------------------------------------

def _e(value) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _labels(rows: list[dict]) -> list[str]:
    """Each row's display name: the model, with its target when the batch has several."""
    several = len({r.get("target") for r in rows}) > 1
    return [f"{r.get('model', '?')} ({r.get('target')})" if several else str(r.get("model", "?"))
            for r in rows]


def _num(value):
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _fmt(value, spec: str = "") -> str:
    value = _num(value)
    return "" if value is None else format(value, spec)


def _phase_names(rows: list[dict]) -> list[str]:
    """Pipeline phases (import, egraph, saturate ...) in the order rows first list them."""
    names: list[str] = []
    for r in rows:
        for name in (r.get("phase_seconds") or {}):
            if name not in names:
                names.append(name)
    return names


def _status_label(row: dict) -> str:
    status = str(row.get("status", "?"))
    stored = row.get("stored_status")
    return f"{status} ({stored})" if status == "reused" and stored and stored != "ok" else status


def _reason(row: dict) -> str:
    """The table's last column: what went wrong, or what the run noted."""
    parts = []
    if row.get("error"):
        phase = f" [last phase: {row['last_phase']}]" if row.get("last_phase") else ""
        parts.append(f"{row['error']}{phase}")
    if row.get("backend_error"):
        parts.append(f"backend: {row['backend_error']}")
    opaque = row.get("opaque_ops") or {}
    if opaque:
        parts.append("opaque: " + ", ".join(f"{k}×{v}" for k, v in opaque.items()))
    parts.extend(str(n) for n in row.get("notices") or [])
    return "; ".join(parts)


# ---- the page ------------------------------------------------------------------------------------

def _header(title: str, rows: list[dict], meta: dict) -> str:
    """The title, the batch's targets, when, how many models ended how, the wall time."""
    targets = sorted({str(r["target"]) for r in rows if r.get("target")} | (
        {str(meta["target"])} if meta.get("target") else set()))
    when = meta.pop("when", None) or time.strftime("%Y-%m-%d %H:%M %Z")
    meta.pop("target", None)
    wall = _num(meta.pop("wall_seconds", None))
    counts = {s: sum(1 for r in rows if r.get("status") == s) for s in STATUS_COLOURS}
    counts["failed"] += counts.pop("error")
    facts = [("targets", ", ".join(targets) or "none"), ("when", when), ("models", str(len(rows)))]
    if wall is not None:
        facts.append(("wall time", f"{wall:.1f} s"))
    facts += [(str(k), str(v)) for k, v in meta.items()]
    tally = " · ".join(f'<span class="st" style="color:{STATUS_COLOURS[s]}">{n} {s}</span>'
                       for s, n in counts.items() if n or s in ("ok", "mismatch", "failed", "reused"))
    items = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in facts)
    return f"<header><h1>{_e(title)}</h1><p class=\"tally\">{tally}</p><dl>{items}</dl></header>"


def _columns(rows: list[dict]) -> list[tuple[str, str]]:
    """(key, heading) of the table's columns; one per pipeline phase that some row timed."""
    work = "kernels" if any(_num(r.get("kernels")) is not None for r in rows) else "cycles"
    cols = [("model", "model"), ("status", "status"), ("speedup", "modelled speed-up"),
            ("onnx_nodes", "ONNX nodes"), ("work", work), ("ratio", f"{work} ÷ ONNX nodes"),
            ("egraph_nodes", "e-graph nodes")]
    cols += [(f"phase:{p}", f"{p} (s)") for p in _phase_names(rows)]
    cols += [("seconds", "total (s)"), ("max_abs_err", "max abs error")]
    if any(_num(r.get("err_ratio")) is not None for r in rows):     # the float64 rule's ratio
        cols.append(("err_ratio", "error ÷ onnxruntime's"))
    return cols + [("reason", "reason / notes")]


def _cell(key: str, row: dict, label: str, out: Path) -> tuple[str, object]:
    """(inner HTML, sort value) of one cell."""
    work = row.get("kernels") if _num(row.get("kernels")) is not None else row.get("cycles")
    if key == "model":
        name = str(row.get("model", ""))
        if name and (out / name / "report.json").is_file():
            return f'<a href="{_e(quote(name) + "/report.json")}">{_e(label)}</a>', label
        return _e(label), label
    if key == "status":
        status = str(row.get("status", "?"))
        colour = STATUS_COLOURS.get(status, "#57606a")
        return f'<span class="st" style="color:{colour}">{_e(_status_label(row))}</span>', status
    if key == "speedup":
        s = _num(row.get("speedup"))
        return ("" if s is None else f"{s:.2f}×"), s
    if key == "work":
        return _fmt(work, ","), _num(work)
    if key == "ratio":
        n, w = _num(row.get("onnx_nodes")), _num(work)
        ratio = w / n if n and w is not None else None
        return _fmt(ratio, ".2f"), ratio
    if key.startswith("phase:"):
        s = _num((row.get("phase_seconds") or {}).get(key[6:]))
        return _fmt(s, ".2f"), s
    if key == "seconds":
        return _fmt(row.get("seconds"), ".1f"), _num(row.get("seconds"))
    if key == "max_abs_err":
        return _fmt(row.get("max_abs_err"), ".1e"), _num(row.get("max_abs_err"))
    if key == "err_ratio":
        return _fmt(row.get("err_ratio"), ".2f"), _num(row.get("err_ratio"))
    if key == "reason":
        text = _reason(row)
        return f'<span class="why">{_e(text)}</span>', text
    value = _num(row.get(key))
    return _fmt(value, ","), value


def _table(rows: list[dict], labels: list[str], out: Path) -> str:
    """The sortable table: one row a model, each cell carrying its sort value."""
    cols = _columns(rows)
    head = "".join(f'<th data-col="{i}" title="click to sort">{_e(h)}</th>' for i, (_, h) in enumerate(cols))
    body = []
    for row, label in zip(rows, labels):
        cells = []
        for key, _ in cols:
            inner, value = _cell(key, row, label, out)
            num = ' data-num="1"' if isinstance(value, (int, float)) else ""
            cls = ' class="txt"' if key in ("model", "status", "reason") else ""
            cells.append(f'<td{cls}{num} data-v="{_e("" if value is None else value)}">{inner}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f'<table id="models"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'
            '<p class="note">Speed-up: modelled by the target\'s cost model, not measured. '
            "Kernels ÷ ONNX nodes below 1: fewer launches than onnxruntime's one per node.</p>")


_STYLE = """body{font-family:system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:24px;color:#1f2328}
h1{margin:0 0 4px}h2{margin:28px 0 8px}.tally{font-size:1.15em;margin:4px 0}.st{font-weight:600}
dl{display:grid;grid-template-columns:max-content auto;gap:2px 12px;margin:8px 0}dt{color:#57606a}dd{margin:0}
table{border-collapse:collapse;font-size:13px}th,td{padding:4px 8px;border-bottom:1px solid #d0d7de;text-align:right}
th{background:#f6f8fa;cursor:pointer;user-select:none;position:sticky;top:0}th:hover{background:#eaeef2}
td.txt{text-align:left}td.txt:last-child{min-width:220px}.why{color:#57606a;font-size:12px}.note{color:#57606a;font-size:12px}
th.asc::after{content:" ▲"}th.desc::after{content:" ▼"}
.plots{display:grid;grid-template-columns:repeat(auto-fit,minmax(600px,1fr));gap:16px}
.plots figure{margin:0}.plots svg{width:100%;height:auto}"""

_SCRIPT = """document.querySelectorAll('#models th').forEach(function(th){th.addEventListener('click',function(){
var t=th.closest('table'),b=t.tBodies[0],i=+th.dataset.col,up=!th.classList.contains('asc');
t.querySelectorAll('th').forEach(function(h){h.classList.remove('asc','desc')});th.classList.add(up?'asc':'desc');
var rs=Array.prototype.slice.call(b.rows);rs.sort(function(a,c){var x=a.cells[i],y=c.cells[i];
var ex=x.dataset.v==='',ey=y.dataset.v==='';if(ex||ey)return ex-ey;
var r=(x.dataset.num&&y.dataset.num)?(+x.dataset.v)-(+y.dataset.v):x.dataset.v.localeCompare(y.dataset.v);
return up?r:-r});rs.forEach(function(r){b.appendChild(r)})})});"""


def _page(title: str, header: str, table: str, plots: list[tuple[str, str]]) -> str:
    figures = "".join(f"<figure>{svg}<figcaption>{_e(cap)}</figcaption></figure>" for cap, svg in plots)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
            f"<style>{_STYLE}</style></head><body>{header}<h2>Models</h2>{table}"
            f'<h2>Plots</h2><div class="plots">{figures}</div><script>{_SCRIPT}</script></body></html>\n')


# ---- plots (matplotlib, inlined as SVG) ---------------------------------------------------------

def _plots(rows: list[dict], labels: list[str]) -> list[tuple[str, str]]:
    """The four plots as (caption, inline SVG). Figures are made without pyplot (no
    backend is chosen or switched, so a notebook's or a GUI's stays as it is)."""
    import matplotlib
    from matplotlib.figure import Figure

    def figure(height: float):
        fig = Figure(figsize=(6.4, height))
        return fig, fig.subplots()

    done = [(r, _mathsafe(lbl)) for r, lbl in zip(rows, labels) if r.get("status") in _DONE]
    style = {"svg.fonttype": "none", "svg.hashsalt": "apsat", "font.size": 9,
             "axes.spines.top": False, "axes.spines.right": False}
    draws = (("Modelled speed-up per model", _plot_speedup),
             ("E-graph size after each saturation phase", _plot_growth),
             ("Seconds per pipeline phase", _plot_times),
             ("Kernels (or cycles) against the ONNX node count", _plot_work))
    with matplotlib.rc_context(style):
        return [(caption, _svg(draw(figure, done), f"p{n}-")) for n, (caption, draw) in enumerate(draws)]


def _mathsafe(text: str) -> str:
    """A label matplotlib draws as written: `$` would start mathtext."""
    return text.replace("$", r"\$")


def _svg(fig, prefix: str) -> str:
    """The figure as an inline <svg> element: no XML prolog or DOCTYPE, ids made unique
    per plot (several SVGs share one HTML document)."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight",
                metadata={"Creator": None, "Date": None, "Format": None, "Type": None})
    text = buf.getvalue()
    text = text[text.index("<svg"):]
    text = re.sub(r'\bid="([^"]+)"', lambda m: f'id="{prefix}{m.group(1)}"', text)
    text = re.sub(r'href="#([^"]+)"', lambda m: f'href="#{prefix}{m.group(1)}"', text)
    return re.sub(r"url\(#([^)]+)\)", lambda m: f"url(#{prefix}{m.group(1)})", text)


def _empty(ax, what: str):
    ax.text(0.5, 0.5, f"no {what} to plot", ha="center", va="center", transform=ax.transAxes, color="#57606a")
    ax.set_xticks([])
    ax.set_yticks([])


def _plot_speedup(figure, done):
    data = [(lbl, r["speedup"]) for r, lbl in done if _num(r.get("speedup")) is not None]
    fig, ax = figure(1.2 + 0.32 * max(len(data), 3))
    if not data:
        _empty(ax, "speed-ups")
        return fig
    names, values = zip(*data)
    ax.barh(range(len(data)), values, color="#0969da")
    ax.set_yticks(range(len(data)), names)
    ax.invert_yaxis()
    ax.axvline(1.0, color="#57606a", lw=0.8, ls="--")
    if max(values) / max(min(values), 1e-9) > 50:
        ax.set_xscale("log")
    for i, v in enumerate(values):
        ax.text(v, i, f" {v:.2f}×", va="center", fontsize=8)
    ax.set_xlabel("modelled speed-up over the unoptimised program (×); dashed: 1×")
    return fig


def _phase_order(done) -> list[str]:
    """Saturation phases of all rows merged in order (each after its predecessor in a row)."""
    order: list[str] = []
    for r, _ in done:
        prev = None
        for p in r.get("phases") or []:
            name = str(p.get("phase"))
            if name not in order:
                order.insert(order.index(prev) + 1 if prev in order else len(order), name)
            prev = name
    return order


def _plot_growth(figure, done):
    order = _phase_order(done)
    fig, ax = figure(4.2)
    lines = [(lbl, [(order.index(str(p.get("phase"))), p["nodes"]) for p in r.get("phases") or []
                    if _num(p.get("nodes")) is not None]) for r, lbl in done]
    lines = [(lbl, pts) for lbl, pts in lines if pts]
    if not lines:
        _empty(ax, "saturation phases")
        return fig
    for lbl, pts in lines:
        xs, ys = zip(*pts)
        ax.plot(xs, ys, marker="o", ms=3, label=lbl)
    ax.set_xticks(range(len(order)), order)
    ys = [y for _, pts in lines for _, y in pts]
    if max(ys) / max(min(ys), 1) > 20:
        ax.set_yscale("log")
    ax.set_xlabel("saturation phase")
    ax.set_ylabel("e-graph nodes after the phase")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    return fig


def _with_other(row: dict) -> dict:
    """The row's phase seconds, plus "other" (start-up, writing the report) when the
    row's total is larger than their sum: each bar is then as long as the model took."""
    phases = {k: v for k, v in row["phase_seconds"].items() if _num(v) is not None}
    rest = (_num(row.get("seconds")) or 0.0) - sum(phases.values())
    return {**phases, "other (untimed)": rest} if rest > 0.05 else phases


def _plot_times(figure, done):
    data = [(lbl, _with_other(r)) for r, lbl in done if r.get("phase_seconds")]
    fig, ax = figure(1.4 + 0.32 * max(len(data), 3))
    if not data:
        _empty(ax, "phase timings")
        return fig
    phases = _phase_names([{"phase_seconds": s} for _, s in data])
    left = [0.0] * len(data)
    from matplotlib import colormaps

    colours = colormaps["tab10"]
    for k, phase in enumerate(phases):
        widths = [_num(s.get(phase)) or 0.0 for _, s in data]
        ax.barh(range(len(data)), widths, left=left, label=phase, color=colours(k % 10))
        left = [a + b for a, b in zip(left, widths)]
    ax.set_yticks(range(len(data)), [lbl for lbl, _ in data])
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    ax.legend(fontsize=7, ncol=min(len(phases), 4), loc="lower right", frameon=False)
    return fig


def _plot_work(figure, done):
    kernels = [(lbl, r["onnx_nodes"], r["kernels"]) for r, lbl in done
               if (_num(r.get("kernels")) or 0) > 0 and (_num(r.get("onnx_nodes")) or 0) > 0]
    cycles = [(lbl, r["onnx_nodes"], r["cycles"]) for r, lbl in done
              if (_num(r.get("cycles")) or 0) > 0 and (_num(r.get("onnx_nodes")) or 0) > 0]
    data = kernels or cycles
    fig, ax = figure(4.6)
    if not data:
        _empty(ax, "kernel or cycle counts")
        return fig
    _, xs, ys = zip(*data)
    ax.scatter(xs, ys, color="#0969da", zorder=3)
    placed: list[tuple[float, float, int]] = []
    for lbl, x, y in sorted(data, key=lambda d: (d[1], d[2])):
        near = {dy for px, py, dy in placed if max(px / x, x / px) < 1.5 and max(py / y, y / py) < 1.3}
        dy = next(d for d in (3, -10, 10, -17) if d not in near or d == -17)
        placed.append((x, y, dy))
        ax.annotate(lbl, (x, y), xytext=(4, dy), textcoords="offset points", fontsize=7)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("ONNX nodes (onnxruntime runs about one kernel per node)")
    if kernels:
        lo, hi = min(xs + ys) * 0.8, max(xs + ys) * 1.25
        ax.plot([lo, hi], [lo, hi], color="#57606a", lw=0.8, ls="--",
                label="y = x: one kernel per ONNX node")
        ax.legend(fontsize=8, loc="upper left", frameon=False)
        ax.set_ylabel("GPU kernels after optimisation")
    else:
        ax.set_ylabel("systolic cycles (modelled)")
    return fig
