"""The batch report a person reads: one self-contained `index.html` (apsat.pipeline.batch rows).

`write_report` writes a header (title, targets, when, how many models ended how, the wall
time), a table of every model (sortable by clicking a column header: a few lines of inline
JavaScript) and the plots of apsat.pipeline.report_plots inlined as SVG: the modelled
speed-up per model (a panel per target), the e-graph's growth over the saturation phases, the
seconds per pipeline phase (every phase of the worker's run, start-up and writing included),
and the kernels (or systolic cycles) against the ONNX model's node count; bar charts hold at
most 50 models a figure, so a corpus's plots stay legible. Nothing is fetched from
elsewhere: no external script, style sheet, font or image. Every text from a row (model
names, error messages: they come from users' files) is escaped. Rows without figures (a
failed or interrupted model) appear in the table with their reason and are left out of the
plots. matplotlib is imported only when a report is written (inside functions).
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
                  "internal error": "#cf222e", "reused": "#0969da", "interrupted": "#9a6700"}
_DONE = ("ok", "mismatch", "reused")


def write_report(rows: list[dict], out_dir, title: str = "apsat zoo", meta: dict | None = None) -> Path:
    """Write `out_dir/index.html` from batch rows (see apsat.pipeline.batch.summary) and
    return its path. `meta` may hold "target", "when" (text; default: now), "wall_seconds"
    (the batch's wall time) and any other key, shown as given in the header. A model's
    name links to `MODEL/report.json` (an internal error's row: `MODEL/traceback.txt`)
    when that file exists under `out_dir`. Raises ApsatError when matplotlib is not
    installed."""
    try:
        import matplotlib
    except ImportError:
        raise ApsatError("the HTML report needs matplotlib: pip install matplotlib") from None
    del matplotlib
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = [r for r in rows if isinstance(r, dict)]
    labels = _labels(rows)
    plots = _plots(rows)
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
    if key == "model":      # links the model's report, or an internal error's traceback
        name, page = str(row.get("model", "")), "traceback.txt" if row.get("internal") else "report.json"
        if name and (out / name / page).is_file():
            return f'<a href="{_e(quote(name) + "/" + page)}">{_e(label)}</a>', label
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
    # in a box of its own that scrolls (header row kept in view): 150 models' rows would
    # otherwise push the plots thousands of pixels down the page
    return (f'<div class="rows"><table id="models"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}'
            '</tbody></table></div><p class="note">Speed-up: modelled by the target\'s cost model, not measured. '
            "Kernels ÷ ONNX nodes below 1: fewer launches than onnxruntime's one per node.</p>")


_STYLE = """body{font-family:system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:24px;color:#1f2328}
h1{margin:0 0 4px}h2{margin:28px 0 8px}.tally{font-size:1.15em;margin:4px 0}.st{font-weight:600}
dl{display:grid;grid-template-columns:max-content auto;gap:2px 12px;margin:8px 0}dt{color:#57606a}dd{margin:0}
table{border-collapse:collapse;font-size:13px}th,td{padding:4px 8px;border-bottom:1px solid #d0d7de;text-align:right}
th{background:#f6f8fa;cursor:pointer;user-select:none;position:sticky;top:0}th:hover{background:#eaeef2}
td.txt{text-align:left}td.txt:first-child{white-space:nowrap}td.txt:last-child{min-width:220px}
.rows{max-height:min(70vh,900px);overflow:auto;border-bottom:1px solid #d0d7de}
.why{color:#57606a;font-size:12px}.note{color:#57606a;font-size:12px}
th.asc::after{content:" ▲"}th.desc::after{content:" ▼"}
.plots{display:grid;grid-template-columns:repeat(auto-fit,minmax(600px,1fr));gap:16px}
.plots figure{margin:0}.plots svg{max-width:100%;height:auto}"""

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


# ---- plots (apsat.pipeline.report_plots draws them; inlined here as SVG) ----------------------

def _plots(rows: list[dict]) -> list[tuple[str, str]]:
    """The plots of the finished rows (apsat.pipeline.report_plots.report_figures: a
    panel per target for speed-ups, a figure per 50 models for the bar charts) as
    (caption, inline SVG)."""
    import matplotlib

    from apsat.pipeline.report_plots import report_figures

    done = [r for r in rows if r.get("status") in _DONE]
    # text stays text (searchable, escaped by matplotlib); ids are the same run to run
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "apsat"}):
        return [(caption, _svg(fig, f"p{n}-")) for n, (caption, fig) in enumerate(report_figures(done))]


def _svg(fig, prefix: str) -> str:
    """The figure as an inline <svg> element: no XML prolog or DOCTYPE, ids made unique
    per plot (several SVGs share one HTML document). Saved as laid out (report_plots
    settles each figure's layout with everything inside it): no "tight" bounding box,
    which would draw every figure twice."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Creator": None, "Date": None, "Format": None, "Type": None})
    text = buf.getvalue()
    text = text[text.index("<svg"):]
    text = re.sub(r'\bid="([^"]+)"', lambda m: f'id="{prefix}{m.group(1)}"', text)
    text = re.sub(r'href="#([^"]+)"', lambda m: f'href="#{prefix}{m.group(1)}"', text)
    return re.sub(r"url\(#([^)]+)\)", lambda m: f"url(#{prefix}{m.group(1)})", text)
