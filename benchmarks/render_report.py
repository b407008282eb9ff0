"""Render a batch report (index.html, apsat.pipeline.report_html) to a PNG with headless Chromium.

    python benchmarks/render_report.py PATH/index.html OUT.png [--width 1400 --height 1800]

With --run, first optimise the nine light-zoo models (seeded random weights, verified
against onnxruntime, GPU target, two worker processes, results not reused) into the
directory of PATH and write the report there; docs/img/zoo-report.png is made this way:

    python benchmarks/render_report.py --run /tmp/zoo-report/index.html docs/img/zoo-report.png

With --synthetic N, write the report from N made-up models on two targets instead
(`synthetic_rows`: realistic names, speed-ups, phases and timings, no model run), to see
the page at corpus scale in seconds; --figures DIR also writes each plot of the report and
of the model-zoo notebook (its cell tagged "figures", run on the same rows) as DIR/*.png,
and --height auto (the default) sizes the screenshot to the whole page:

    python benchmarks/render_report.py --synthetic 150 /tmp/corpus/index.html /tmp/corpus/page.png \
        --figures /tmp/corpus/figures

Needs a `chromium` (or chromium-browser / google-chrome) on PATH: on Debian,
`apt-get install -y chromium`.
"""
from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # run from a checkout

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def run_light_zoo(out_dir: Path, target: str = "gpu", jobs: int = 2) -> Path:
    """Optimise the light zoo into `out_dir` with run_local and write its index.html."""
    from apsat.pipeline.batch import Task, run_local
    from apsat.pipeline.report_html import write_report
    from apsat.pipeline.zoo import light_model_paths

    tasks = [Task(p.stem.replace("light_", ""), str(p), target, out=str(out_dir), randomize=True,
                  options={"verify": True}) for p in light_model_paths()]
    start = time.perf_counter()
    rows = run_local(tasks, jobs=jobs)
    wall = time.perf_counter() - start
    for r in rows:      # the phases' sum beside the total: what no phase owns shows as their gap
        timed = sum((r.get("phase_seconds") or {}).values())
        print(f"{r['model']:>16}  {r['status']:<8} {r.get('seconds') or 0:6.1f} s  phases {timed:6.1f} s  "
              f"{r.get('error', '')}")
    return write_report(rows, out_dir, title="apsat zoo: the onnx light models",
                        meta={"target": target, "wall_seconds": wall, "jobs": jobs})


GPU_PLAN = ["affine", "layout", "algebra", "fusion", "relayout"]
SYSTOLIC_PLAN = ["affine", "layout", "fusion", "relayout", "im2col", "systolic"]
FAMILIES = ["resnet", "mobilenet-v3", "efficientnet", "bert-base-uncased", "vit-b16", "convnext-tiny",
            "squeezenet", "inception-v3", "densenet121", "yolov5s-detection-head", "whisper-encoder"]


def _phase_seconds(rng: random.Random, target: str) -> dict:
    """Made-up seconds for every phase a worker times (apsat.pipeline.batch.run_task)."""
    names = ["startup", "prepare", "setup", "import", "egraph", "saturate", "extract", "lower",
             "oracle", "verify", "backend check"] + (["systolic run"] if target != "gpu" else []) + ["write"]
    scale = {"saturate": 3.0, "oracle": 1.5, "extract": 0.8, "systolic run": 1.2, "startup": 0.4}
    return {n: rng.uniform(0.2, 1.0) * scale.get(n, 0.15) for n in names}


def synthetic_rows(n: int = 150, targets=("gpu", "systolic:32x32"), seed: int = 0) -> list[dict]:
    """n batch rows a target (apsat.pipeline.batch.summary's keys, "model" and "target"),
    made up but shaped like real ones: gpu speed-ups 1.1x to 2.9x, systolic ones 20x to
    900x, each target's saturation phases, long model names (one with `$` and `<`), the
    phase seconds adding up to "seconds". No model runs: a corpus-scale page in seconds."""
    rng = random.Random(seed)
    names = [f"{FAMILIES[i % len(FAMILIES)]}-{i:03d}" + ("-opset17-int8-calibrated" if i % 7 == 0 else "")
             for i in range(n)]
    if n > 3:
        names[3] = "price$model<v2>"
    rows = []
    for target in targets:
        plan = GPU_PLAN if target == "gpu" else SYSTOLIC_PLAN
        for name in names:
            onnx_nodes = int(10 ** rng.uniform(1.3, 3.3))
            nodes = int(onnx_nodes * rng.uniform(4, 9))
            phases = []
            for phase in plan:
                nodes = int(nodes * rng.uniform(1.0, 2.2))
                phases.append({"phase": phase, "nodes": nodes, "seconds": rng.uniform(0.05, 1.0)})
            secs = _phase_seconds(rng, target)
            gpu = target == "gpu"
            rows.append({"model": name, "path": f"/corpus/{name}.onnx", "target": target, "status": "ok",
                         "speedup": rng.uniform(1.1, 2.9) if gpu else 10 ** rng.uniform(1.3, 2.95),
                         "kernels": int(onnx_nodes * rng.uniform(0.3, 0.9)) if gpu else None,
                         "cycles": None if gpu else int(onnx_nodes * rng.uniform(2e3, 4e4)),
                         "onnx_nodes": onnx_nodes, "egraph_nodes": nodes, "phases": phases,
                         "phase_seconds": secs, "seconds": sum(secs.values()) * 1.005,
                         "max_abs_err": rng.uniform(1e-7, 1e-5), "err_ratio": rng.uniform(0.5, 2),
                         "opaque_ops": {}, "notices": [], "peak_mib": rng.randint(300, 3000)})
    return rows


def notebook_figures(rows: list[dict], notebook: Path = Path(__file__).resolve().parent.parent
                     / "notebooks" / "04-model-zoo.ipynb") -> list:
    """The Figures that the notebook's cell tagged "figures" displays when its `plot_rows`
    are `rows` (the cell run here, outside Jupyter, with `display` collecting them)."""
    cells = [c for c in json.loads(notebook.read_text())["cells"]
             if "figures" in c.get("metadata", {}).get("tags", [])]
    if len(cells) != 1:
        raise SystemExit(f"render_report: {notebook.name} has {len(cells)} cells tagged 'figures', not one")
    shown: list = []
    source = "".join(cells[0]["source"])
    exec(compile(source, f"{notebook.name}[figures]", "exec"), {"plot_rows": rows, "display": shown.append})
    return shown


def write_figures(rows: list[dict], directory: Path) -> list[Path]:
    """Each plot of the report (report_figures) and of the notebook as a PNG under
    `directory` (matplotlib's own renderer, 100 dpi); returns the paths."""
    from apsat.pipeline.report_plots import report_figures

    directory.mkdir(parents=True, exist_ok=True)
    named = [(f"report-{i:02d}-{re.sub(r'[^a-z0-9]+', '-', cap.lower()).strip('-')[:48]}", fig)
             for i, (cap, fig) in enumerate(report_figures(rows))]
    named += [(f"notebook-{i:02d}", fig) for i, fig in enumerate(notebook_figures(rows))]
    paths = []
    for name, fig in named:
        fig.savefig(directory / f"{name}.png", dpi=100)
        paths.append(directory / f"{name}.png")
    return paths


def page_height(html: Path, width: int) -> int:
    """A screenshot height that holds the whole page (generous: render crops the blank
    end): the header, the table's scrolling box (at most 900 px, 30 px a row) and the
    plots, two to a row, each at its natural size or shrunk to its column."""
    text = html.read_text(encoding="utf-8")
    sizes = [(float(w), float(h)) for w, h in re.findall(r'<svg[^>]*?width="([\d.]+)pt" height="([\d.]+)pt"', text)]
    column = (width - 64) / 2
    heights = [h * min(1.0, column / (w * 4 / 3)) * 4 / 3 for w, h in sizes]     # pt to CSS px
    plots = sum(max(heights[i:i + 2]) + 60 for i in range(0, len(heights), 2))
    return int(500 + min(900, 30 * text.count("<tr>")) + plots)


def _crop_blank_end(png: Path) -> None:
    """Cut the blank rows at the bottom of a screenshot taller than its page."""
    from PIL import Image, ImageChops

    with Image.open(png) as im:
        rgb = im.convert("RGB")
    background = Image.new("RGB", rgb.size, rgb.getpixel((rgb.width - 1, rgb.height - 1)))
    box = ImageChops.difference(rgb, background).getbbox()
    if box and box[3] + 24 < rgb.height:
        rgb.crop((0, 0, rgb.width, box[3] + 24)).save(png)


def render(html: Path, png: Path, width: int = 1400, height: int = 1800) -> Path:
    """Screenshot `html` (a local file) into `png` with headless Chromium; returns `png`."""
    browser = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    if browser is None:
        sys.exit("render_report: no chromium on PATH (Debian: apt-get install -y chromium)")
    png = png.resolve()
    png.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="render-report-") as profile:
        cmd = [browser, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
               "--force-device-scale-factor=1", f"--user-data-dir={profile}",
               f"--window-size={width},{height}", f"--screenshot={png}", html.resolve().as_uri()]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0 or not png.is_file():
        sys.exit(f"render_report: chromium failed ({proc.returncode}): {proc.stderr.strip()[-500:]}")
    _crop_blank_end(png)
    return png


def main() -> None:
    """The command line (see the module's docstring)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("html", type=Path, help="the report's index.html")
    ap.add_argument("png", type=Path, help="the PNG to write")
    ap.add_argument("--run", action="store_true", help="first run the light zoo into the report's directory")
    ap.add_argument("--synthetic", type=int, metavar="N", help="first write the report from N made-up models a target")
    ap.add_argument("--figures", type=Path, metavar="DIR", help="with --synthetic: also each plot as DIR/*.png")
    ap.add_argument("--target", default="gpu", help="with --run: the target (default gpu)")
    ap.add_argument("--jobs", type=int, default=2, help="with --run: worker processes (default 2)")
    ap.add_argument("--width", type=int, default=1400)
    ap.add_argument("--height", default="auto", help="pixels, or auto: the whole page (default)")
    args = ap.parse_args()
    if args.run:
        print(f"report: {run_light_zoo(args.html.parent, args.target, args.jobs)}")
    elif args.synthetic:
        from apsat.pipeline.report_html import write_report

        rows = synthetic_rows(args.synthetic)
        meta = {"wall_seconds": sum(r["seconds"] for r in rows) / 2, "jobs": 2}
        title = f"apsat zoo: {args.synthetic} synthetic models"
        print(f"report: {write_report(rows, args.html.parent, title=title, meta=meta)}")
        for path in write_figures(rows, args.figures) if args.figures else []:
            print(f"figure: {path}")
    elif not args.html.is_file():
        sys.exit(f"render_report: {args.html} does not exist (use --run or --synthetic to make it)")
    height = page_height(args.html, args.width) if args.height == "auto" else int(args.height)
    png = render(args.html, args.png, args.width, height)
    print(f"{png}: {png.stat().st_size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
