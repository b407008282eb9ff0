"""The batch report (apsat.pipeline.report_html): one self-contained index.html with every
model in a sortable table, four matplotlib plots inlined as SVG, every user text escaped."""
from __future__ import annotations

import ast
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from apsat.errors import ApsatError
from apsat.pipeline.batch import Task, run_task
from apsat.pipeline.report_html import write_report
from apsat.pipeline.zoo import light_model_paths

NASTY = "<script>alert(1)</script>"
FAILED = {"model": "broken-model", "path": "broken.onnx", "target": "gpu", "status": "failed",
          "error": "worker died (killed by signal SIGKILL) in phase saturate & <b>", "seconds": 3.0,
          "last_phase": "saturate"}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """Rows of two real light models (random weights, verified), a failed row and a
    reused row with a nasty name; the report written from them, and its text."""
    out = tmp_path_factory.mktemp("zoo")
    rows = [run_task(Task(p.stem.replace("light_", ""), str(p), out=str(out), randomize=True,
                          options={"verify": True}))
            for p in light_model_paths() if "alexnet" in p.name or "squeezenet" in p.name]
    assert [r["status"] for r in rows] == ["ok", "ok"], rows
    reused = {**rows[0], "model": NASTY, "status": "reused", "stored_status": "ok"}
    rows += [FAILED, reused]
    path = write_report(rows, out, title="zoo <test>", meta={"target": "gpu", "wall_seconds": 12.5})
    return rows, path, path.read_text(encoding="utf-8")


def _svgs(page: str) -> list[str]:
    return re.findall(r"<svg\b.*?</svg>", page, flags=re.S)


def test_every_model_is_in_the_table_with_its_reason(report):
    rows, path, page = report
    assert path.name == "index.html" and path.parent.joinpath("bvlc_alexnet", "report.json").is_file()
    table = page[page.index('<table id="models"'):page.index("</table>")]
    assert table.count("<tr>") == len(rows) + 1                    # the header and one row a model
    for name in ("bvlc_alexnet", "squeezenet", "broken-model", "&lt;script&gt;alert(1)&lt;/script&gt;"):
        assert name in table
    assert 'href="bvlc_alexnet/report.json"' in table and 'href="squeezenet/report.json"' in table
    assert "broken-model/report.json" not in table                 # no report, no link
    assert "worker died (killed by signal SIGKILL) in phase saturate &amp; &lt;b&gt;" in table
    assert ">failed<" in table and ">reused<" in table and ">ok<" in table
    assert "<th data-col=" in table and "addEventListener('click'" in page    # sortable
    assert "zoo &lt;test&gt;" in page and "12.5 s" in page and "gpu" in page


def test_four_inline_svg_plots_that_parse(report):
    _, _, page = report
    assert page.count("<svg") == 4
    svgs = _svgs(page)
    assert len(svgs) == 4
    for svg in svgs:
        ET.fromstring(svg)                       # well-formed XML: no prolog, nothing broken
    assert "<?xml" not in page and "<!DOCTYPE svg" not in page
    ids = re.findall(r'\bid="([^"]+)"', "".join(svgs))
    assert len(ids) == len(set(ids))             # several SVGs in one document: ids stay unique
    joined = "".join(svgs)
    assert "broken-model" not in joined          # a failed row has no figures to plot
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in joined       # the reused row has
    assert "y = x" in svgs[3]


def test_the_page_is_self_contained_and_escaped(report):
    _, _, page = report
    assert NASTY not in page
    assert page.count("<script") == 1 and "<script src" not in page
    assert "<link" not in page and "@import" not in page and "@font-face" not in page
    assert not re.search(r"\bsrc\s*=", page)
    assert not re.findall(r'href="[^"#]*://', page) and not re.findall(r"url\((?!#)", page)
    bare = re.sub(r'xmlns(:\w+)?="http://www\.w3\.org/[^"]*"', "", page)
    assert "http://" not in bare and "https://" not in bare


def test_a_batch_without_figures_still_has_its_four_plots(tmp_path):
    page = write_report([FAILED], tmp_path).read_text(encoding="utf-8")
    assert len(_svgs(page)) == 4 and "no speed-ups to plot" in page
    assert "1 failed" in page and "broken-model" in page


def test_without_matplotlib_the_report_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)            # import matplotlib -> ImportError
    with pytest.raises(ApsatError, match="pip install matplotlib"):
        write_report([FAILED], tmp_path)
    assert not (tmp_path / "index.html").exists()


def test_matplotlib_is_imported_only_inside_functions():
    source = Path(sys.modules[write_report.__module__].__file__).read_text()
    top = [n for n in ast.parse(source).body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = [a.name for n in top for a in n.names] + [n.module or "" for n in top if isinstance(n, ast.ImportFrom)]
    assert not [n for n in names if n.startswith("matplotlib")]
