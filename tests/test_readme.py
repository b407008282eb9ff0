"""The README is tested: every ```python block runs as written, the README stays a short
front door (at most 300 lines), every relative link in it reaches an existing file (and
heading, where it names one), and the `apsat optimize` example prints what the README shows."""
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 300


def test_readme_python_blocks_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks, "README has no python example"
    for block in blocks:
        exec(compile(block, str(README), "exec"), {})


def test_readme_is_short():
    n = len(README.read_text().splitlines())
    assert n <= MAX_LINES, f"README.md has {n} lines (at most {MAX_LINES}); move detail to docs/"


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)   # no headings in code
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.*)$", text, re.M)}


def _relative_links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    return [t for t in links if not re.match(r"[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]


def _broken_links(page: Path) -> list[str]:
    """The relative links of `page` whose file or heading anchor does not exist."""
    broken = []
    for target in _relative_links(page):
        file, _, anchor = target.partition("#")
        path = (page.parent / file).resolve()
        if not path.is_file():
            broken.append(f"{page.name}: {target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(f"{page.name}: {target}: no heading with that anchor")
    return broken


def test_readme_links_into_docs_resolve():
    links = _relative_links(README)
    assert any(t.startswith("docs/") for t in links), "README links nowhere into docs/"
    assert not _broken_links(README), _broken_links(README)


def test_docs_links_resolve():
    """Links between the docs pages (and back to the README) resolve too."""
    broken = [b for page in sorted((ROOT / "docs").glob("*.md")) for b in _broken_links(page)]
    assert not broken, broken


# ---- the `apsat optimize` example ------------------------------------------------------------

def _example():
    """The README's console block holding `$ apsat optimize $LIGHT/...` (a light zoo model):
    (argv after `apsat`, so starting with `optimize`; the output lines shown)."""
    for block in re.findall(r"```console\n(.*?)```", README.read_text(), re.S):
        lines = block.splitlines()
        for i, line in enumerate(lines):
            if line.startswith("$ apsat optimize $LIGHT/"):     # not the rules section's
                return shlex.split(line[2:])[1:], [ln for ln in lines[i + 1:] if not ln.startswith("$")]
    pytest.fail("README shows no `$ apsat optimize $LIGHT/...` example")


def _row(lines, first_cell):
    """The cells of the table row whose first cell is `first_cell` (rich's box drawing)."""
    for line in lines:
        cells = [c.strip() for c in re.split(r"[│┃]", line)[1:-1]]
        if cells and cells[0] == first_cell:
            return cells
    return None


def test_readme_optimize_example_runs(tmp_path):
    import onnx

    argv, shown = _example()
    light = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
    argv = [a.replace("$LIGHT", str(light)) for a in argv]
    # Run in an empty directory: the default --out is apsat-out/ there, as the README shows.
    proc = subprocess.run([sys.executable, "-m", "apsat.cli", *argv], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    printed = proc.stdout.splitlines()

    header_shown, header_printed = _row(shown, "model"), _row(printed, "model")
    assert header_shown and header_printed == header_shown, (header_shown, header_printed)
    model = Path(next(a for a in argv if a.endswith(".onnx"))).stem
    row_shown, row_printed = _row(shown, model), _row(printed, model)
    assert row_shown, f"README's example output has no row for {model}"
    assert row_printed, proc.stdout
    # Every column but the time and the float errors: a change of rules, extractor or cost
    # model that moves these numbers must update the README's example with it.
    cols = dict(zip(header_shown, zip(row_shown, row_printed)))
    differ = [f"{col}: README shows {a!r}, the run printed {b!r}" for col, (a, b) in cols.items()
              if col not in ("seconds", "max err", "err ÷ ort") and a != b]
    assert not differ, differ
    assert cols["verify"][1] == "ok"
    tail = [ln.strip() for ln in shown if ln.strip().startswith("reports written under")]
    assert tail and tail[0] in [ln.strip() for ln in printed]
    out = tmp_path / "apsat-out" / model
    assert (out / "report.json").is_file() and (out / "program.txt").is_file()
    claimed = re.search(r"(\d+)\s+`fused-dot-bias-act`", README.read_text())
    if claimed:     # the prose's count of fused kernels in program.txt
        report = json.loads((out / "report.json").read_text())
        assert report["ops_after"].get("fused-dot-bias-act") == int(claimed.group(1)), report["ops_after"]


def test_readme_language_tables_name_every_registry_op():
    """The language's two tables list every op and compute operator of the registry, so
    adding an op to the registry without the README fails here."""
    from apsat.lang.ops import COMPUTE_OPS, OPS

    text = README.read_text()
    section = text[text.index("## The language"):text.index("## Writing a rule")]
    table_cells = " ".join(line for line in section.splitlines() if line.startswith("|"))
    named = set(re.findall(r"`\(?([a-z][a-z0-9-]*)", table_cells))
    spelled = {n for n in named} | {f"elementwise-{x}" for x in ("add", "mul", "sub", "div", "pow")
                                    if "elementwise-add/mul" in table_cells}
    missing = sorted((set(OPS) | set(COMPUTE_OPS)) - spelled)
    assert not missing, f"README's language tables do not name {missing}"
