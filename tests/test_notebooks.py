"""The notebooks in notebooks/ run from a clean kernel without error (outputs are stripped
in the repository; this executes them in memory and writes nothing back)."""
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


def test_the_four_notebooks_are_there():
    assert [p.name[:2] for p in NOTEBOOKS] == ["01", "02", "03", "04"]


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_clean(path):
    nbformat = pytest.importorskip("nbformat", reason="the test extra installs nbformat")
    nbclient = pytest.importorskip("nbclient", reason="the test extra installs nbclient")
    nb = nbformat.read(str(path), as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), \
        f"{path.name} is committed with outputs; strip them"
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()   # raises CellExecutionError naming the cell on any error
