"""Render a batch report (index.html, apsat.pipeline.report_html) to a PNG with headless Chromium.

    python benchmarks/render_report.py PATH/index.html OUT.png [--width 1400 --height 1800]

With --run, first optimise the nine light-zoo models (seeded random weights, verified
against onnxruntime, GPU target, two worker processes, results not reused) into the
directory of PATH and write the report there; docs/img/zoo-report.png is made this way:

    python benchmarks/render_report.py --run /tmp/zoo-report/index.html docs/img/zoo-report.png

Needs a `chromium` (or chromium-browser / google-chrome) on PATH: on Debian,
`apt-get install -y chromium`.
"""
from __future__ import annotations

import argparse
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
    for r in rows:
        print(f"{r['model']:>16}  {r['status']:<8} {r.get('seconds') or 0:6.1f} s  {r.get('error', '')}")
    return write_report(rows, out_dir, title="apsat zoo: the onnx light models",
                        meta={"target": target, "wall_seconds": wall, "jobs": jobs})


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
    return png


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("html", type=Path, help="the report's index.html")
    ap.add_argument("png", type=Path, help="the PNG to write")
    ap.add_argument("--run", action="store_true", help="first run the light zoo into the report's directory")
    ap.add_argument("--target", default="gpu", help="with --run: the target (default gpu)")
    ap.add_argument("--jobs", type=int, default=2, help="with --run: worker processes (default 2)")
    ap.add_argument("--width", type=int, default=1400)
    ap.add_argument("--height", type=int, default=1800)
    args = ap.parse_args()
    if args.run:
        print(f"report: {run_light_zoo(args.html.parent, args.target, args.jobs)}")
    elif not args.html.is_file():
        sys.exit(f"render_report: {args.html} does not exist (use --run to make it)")
    png = render(args.html, args.png, args.width, args.height)
    print(f"{png}: {png.stat().st_size / 1024:.0f} KiB")


if __name__ == "__main__":
    main()
