"""Files stay a few hundred lines and functions do one thing: no source file of apsat (Python
or egglog) over 400 lines, no Python function over 60. Split by meaning, not by cramming."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "apsat"
MAX_FILE_LINES, MAX_FUNCTION_LINES = 400, 60


def test_no_file_over_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in sorted(ROOT.rglob("*"))
            if p.suffix in (".py", ".egg") and (n := p.read_text().count("\n")) > MAX_FILE_LINES}
    assert not long, f"files over {MAX_FILE_LINES} lines: {long}"


def test_no_function_over_60_lines():
    long = [f"{p.relative_to(ROOT)}:{f.lineno} {f.name} ({f.end_lineno - f.lineno + 1} lines)"
            for p in sorted(ROOT.rglob("*.py")) for f in ast.walk(ast.parse(p.read_text()))
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            and f.end_lineno - f.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: {long}"
