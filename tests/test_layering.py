"""The data flow has one direction: egraph/ and rules/ never import extract/ or backends/;
extract/ never imports backends/ (checked on the source text, imports inside functions too)."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "apsat"
FORBIDDEN = {"egraph": ("extract", "backends"), "rules": ("extract", "backends"), "extract": ("backends",)}


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_upward_imports(package):
    pattern = re.compile(r"^\s*(from|import)\s+apsat\.(%s)\b" % "|".join(FORBIDDEN[package]), re.M)
    offenders = [f"{p.relative_to(ROOT)}: {m.group(0).strip()}"
                 for p in (ROOT / package).rglob("*.py") for m in pattern.finditer(p.read_text())]
    assert not offenders, offenders
