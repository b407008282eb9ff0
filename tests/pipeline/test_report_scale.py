"""The report's plots stay legible at corpus scale, and every second of a model's run is
some phase's.

150 synthetic models on two targets (benchmarks/render_report.py's synthetic_rows: no model
runs, so this takes seconds) go through the plots of index.html (apsat.pipeline.report_plots)
and through the model-zoo notebook's cell tagged "figures"; each figure is drawn, written
as a PNG and measured in pixels (100 dpi): no two texts overlap, every gpu bar is wide
enough to see beside systolic speed-ups in the hundreds, every model row is tall enough
for its label, no figure grows without bound. One tiny real model checks the timing:
startup, prepare, optimize's phases and write add up to the row's seconds."""
from __future__ import annotations

import importlib.util
import itertools
import queue
import shutil
import time
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from apsat.pipeline import report_plots                               # noqa: E402
from apsat.pipeline.batch import Task, _worker                        # noqa: E402
from apsat.pipeline.report_html import write_report                   # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
N_MODELS = 150
MIN_BAR_PX = 8            # the shortest gpu bar, at 100 dpi
MIN_ROW_PX = 15           # a model's row (7-pt labels are about 10 px high)
MAX_HEIGHT_IN = 12.5      # no figure taller, however many models


def _render_report_module():
    spec = importlib.util.spec_from_file_location("bench_render_report", ROOT / "benchmarks" / "render_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench():
    return _render_report_module()


@pytest.fixture(scope="module")
def rows(bench):
    return bench.synthetic_rows(N_MODELS)


@pytest.fixture(scope="module")
def report_figs(rows):
    return report_plots.report_figures(rows)


@pytest.fixture(scope="module")
def index_html(rows, report_figs, tmp_path_factory):
    """index.html of the 150 models, its plots the figures already drawn (report_figs: the
    same call write_report makes), so that the page costs only their SVG."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(report_plots, "report_figures", lambda done: report_figs)
        return write_report(rows, tmp_path_factory.mktemp("index"))


def _drawn_texts(fig) -> list:
    """Every text the figure draws (non-empty, visible): the tick labels of ticks in view,
    titles, axis labels, texts and annotations in the axes, legend entries."""
    texts = []
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            # _update_ticks: the ticks that are drawn (in view), as Axis.draw takes them
            for tick in axis._update_ticks():
                texts += [t for t in (tick.label1, tick.label2) if t.get_visible()]
            texts.append(axis.label)
        texts += [ax.title, ax._left_title, ax._right_title, *ax.texts]
        if ax.get_legend():
            texts += ax.get_legend().get_texts()
    for legend in fig.legends:
        texts += legend.get_texts()
    return [t for t in texts if t.get_visible() and t.get_text().strip()]


def _assert_legible(fig, caption: str) -> None:
    """No two drawn texts overlap; every text lies inside the figure; the figure is not
    taller than MAX_HEIGHT_IN; every row of a bar chart is MIN_ROW_PX high. The figures
    come laid out and frozen: a draw (as saving makes) places the legends, moving nothing."""
    fig.draw_without_rendering()
    assert fig.get_size_inches()[1] <= MAX_HEIGHT_IN, caption
    frame = fig.bbox
    boxes = [(t.get_text(), t.get_window_extent()) for t in _drawn_texts(fig)]
    for text, box in boxes:
        assert frame.x0 - 1 <= box.x0 and box.x1 <= frame.x1 + 1 and frame.y0 - 1 <= box.y0 \
            and box.y1 <= frame.y1 + 1, f"{caption}: {text!r} outside the figure"
    for (a, ba), (b, bb) in itertools.combinations(boxes, 2):
        overlap_w = min(ba.x1, bb.x1) - max(ba.x0, bb.x0)
        overlap_h = min(ba.y1, bb.y1) - max(ba.y0, bb.y0)
        assert overlap_w <= 0.5 or overlap_h <= 0.5, f"{caption}: {a!r} overlaps {b!r}"
    for ax in fig.axes:
        labels = [t for t in ax.get_yticklabels() if t.get_text()]
        if len(labels) > 3:                       # a bar chart: one row a model
            row_px = ax.get_window_extent().height / len(labels)
            assert row_px >= MIN_ROW_PX, f"{caption}: rows of {row_px:.1f} px"


def _speedup_panels(figs) -> list:
    return [ax for cap, fig in figs if cap.startswith("Modelled speed-up") for ax in fig.axes]


def _assert_gpu_bars_visible(figs) -> int:
    """Every gpu bar is at least MIN_BAR_PX wide inside its panel; returns how many."""
    gpu = [ax for ax in _speedup_panels(figs) if ax.get_title() == "gpu"]
    assert gpu, "no gpu panel"
    count = 0
    for ax in gpu:
        frame = ax.get_window_extent()
        for bar in ax.patches:
            box = bar.get_window_extent()
            visible = min(box.x1, frame.x1) - max(box.x0, frame.x0)
            assert visible >= MIN_BAR_PX, f"a gpu bar of {visible:.1f} px"
            count += 1
    return count


def test_report_plots_are_legible_for_150_models(report_figs, tmp_path):
    captions = [cap for cap, _ in report_figs]
    # a figure a 50 models for the bar charts; one for the growth lines and one for the scatter
    assert sum(c.startswith("Modelled speed-up") for c in captions) == 3
    assert sum(c.startswith("Seconds per pipeline phase") for c in captions) == 6     # 300 rows
    assert "(models 101–150 of 150)" in captions[2]
    for caption, fig in report_figs:
        _assert_legible(fig, caption)
    for name, k in (("speedups", 0), ("times", 4)):         # matplotlib's own PNG, as saved
        report_figs[k][1].savefig(tmp_path / f"{name}.png", dpi=100)
        assert (tmp_path / f"{name}.png").stat().st_size > 10_000


def test_speedups_get_a_panel_and_an_axis_per_target(report_figs, rows):
    panels = _speedup_panels(report_figs)
    assert [ax.get_title() for ax in panels[:2]] == ["gpu", "systolic:32x32"]
    by_title = {ax.get_title(): ax for ax in panels}
    assert by_title["gpu"].get_xscale() == "linear" and by_title["systolic:32x32"].get_xscale() == "log"
    assert _assert_gpu_bars_visible(report_figs) == N_MODELS
    # on one shared axis the same gpu bars would be a pixel or two: the failure this prevents
    largest = max(r["speedup"] for r in rows)
    smallest_gpu = min(r["speedup"] for r in rows if r["target"] == "gpu")
    assert smallest_gpu / largest * by_title["gpu"].get_window_extent().width < MIN_BAR_PX


def test_phase_names_are_legend_entries_not_inline_text(report_figs):
    times = [fig for cap, fig in report_figs if cap.startswith("Seconds per pipeline phase")]
    entries = [t.get_text() for t in times[0].legends[0].get_texts()]
    assert entries[:3] == ["startup", "prepare", "setup"] and entries[-2:] == ["systolic run", "write"]
    assert report_plots.OTHER not in entries           # the synthetic rows' phases add up
    assert not times[0].axes[0].texts                  # no free text over the bars


def test_untimed_time_is_shown_as_such():
    row = {"model": "old", "target": "gpu", "status": "ok", "seconds": 10.0,
           "phase_seconds": {"import": 1.0, "saturate": 2.0}}
    (_, fig), = report_plots.time_figures([row])
    assert report_plots.OTHER in [t.get_text() for t in fig.legends[0].get_texts()]


def test_a_model_without_a_result_for_a_target_gets_a_dash_not_a_bar(bench):
    rows = bench.synthetic_rows(5)
    rows = [r for r in rows if not (r["target"] != "gpu" and r["model"] == rows[1]["model"])]
    (_, fig), = report_plots.speedup_figures(rows)
    gpu, systolic = fig.axes
    assert len(gpu.patches) == 5 and len(systolic.patches) == 4
    assert [t.get_text() for t in systolic.texts][1] == " –"


def test_the_notebooks_figures_are_legible_for_150_models(bench, rows, tmp_path):
    figs = bench.notebook_figures(rows)
    assert len(figs) == 3 + 1                          # the speed-up pages, the growth panels
    captioned = [(f"notebook figure {i}", fig) for i, fig in enumerate(figs)]
    for caption, fig in captioned:
        _assert_legible(fig, caption)
    assert _assert_gpu_bars_visible([("Modelled speed-up", f) for f in figs[:3]]) == N_MODELS
    growth = figs[3]
    assert [ax.get_title() for ax in growth.axes] == ["gpu", "systolic:32x32"]
    assert [t.get_text() for t in growth.axes[1].get_xticklabels()][-2:] == ["im2col", "systolic"]
    figs[0].savefig(tmp_path / "speedups.png", dpi=100)
    assert (tmp_path / "speedups.png").stat().st_size > 10_000


def test_a_light_zoo_keeps_its_names_and_long_phase_names_stand_up(bench):
    rows = bench.synthetic_rows(9, targets=("gpu",))
    rows[0]["phases"][0]["phase"] = "attention-fusion"          # a long phase name: labels at 90°
    figs = report_plots.report_figures(rows)
    for caption, fig in figs:
        _assert_legible(fig, caption)
    (work,) = [fig for cap, fig in figs if cap.startswith("Kernels")]
    assert len(work.axes[0].texts) == 9                          # nine points, nine names
    (growth,) = [fig for cap, fig in figs if cap.startswith("E-graph")]
    assert {t.get_rotation() for t in growth.axes[0].get_xticklabels()} == {90.0}
    assert len(growth.legends[0].get_texts()) == 9               # nine models: named lines


def test_index_html_of_150_models(index_html):
    page = index_html.read_text(encoding="utf-8")
    assert page.count("<svg") == 11 and "(models 101–150 of 150)" in page
    assert "price$model&lt;v2&gt;" in page                       # the nasty name, escaped
    assert page.count("<tr>") == 2 * N_MODELS + 1


@pytest.mark.skipif(shutil.which("chromium") is None, reason="headless chromium is not installed")
def test_index_html_renders_in_chromium(bench, index_html):
    """The page as a browser draws it (Debian's chromium, headless): all of it, plots included."""
    try:
        png = bench.render(index_html, index_html.parent / "page.png", 1400, bench.page_height(index_html, 1400))
    except SystemExit as e:               # chromium present but unable to start here
        pytest.skip(str(e))
    from PIL import Image

    with Image.open(png) as im:
        # the table scrolls in its own box: the eleven plots follow it within the page
        assert im.width == 1400 and 5000 < im.height < 20000
        plots = im.convert("L").crop((0, 1500, 1400, im.height))
        dark = sum(plots.histogram()[:160])                # bars and text, not a blank page
        assert dark > 0.05 * plots.width * plots.height


def test_every_second_of_a_run_is_a_phase(tmp_path):
    """A worker's row (run in this process: `_worker` told it was spawned 0.3 s ago): its
    phases, startup and write included, add up to its seconds within 3% (and 20 ms)."""
    import onnx

    from models import mlp3

    path = tmp_path / "mlp3.onnx"
    onnx.save(mlp3(), str(path))
    results, events = queue.Queue(), queue.Queue()
    _worker(Task("mlp3", str(path), "systolic:8x8", out=str(tmp_path), options={"verify": True}),
            results, events, time.time() - 0.3)
    row = results.get_nowait()
    assert row["status"] == "ok", row
    phases = row["phase_seconds"]
    assert list(phases)[:4] == ["startup", "prepare", "setup", "import"] and list(phases)[-1] == "write"
    assert {"backend check", "oracle", "verify"} <= set(phases) and 0.3 <= phases["startup"] < 1.0
    assert abs(sum(phases.values()) - row["seconds"]) <= 0.03 * row["seconds"] + 0.02, phases
