"""Internal errors keep the error contract: an unexpected exception inside apsat (a bug: a
RecursionError, KeyError, AssertionError, MemoryError ...) is one stderr line, "apsat:
internal error in PHASE: TYPE: MESSAGE (traceback: PATH)", exit status 4, the traceback in
a file; from Python, apsat.errors.InternalError (not an ApsatError) naming the phase, its
__cause__ the original. Each fault is planted by monkeypatching one phase's function, in
process; the zoo's worker processes get theirs from a sitecustomize module (below)."""
import importlib
import json
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from models import single_op

import apsat
from apsat.cli import EXIT_INTERNAL_ERROR, EXIT_OK, main
from apsat.errors import ApsatError, InternalError

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"^apsat: (?:(?P<model>[\w-]+): )?internal error in (?P<phase>[\w ]+): "
                  r"(?P<type>\w+)(?:: (?P<message>.*))? \(traceback: (?P<path>[^()]+)\)$")


def _recurse(*args):
    """A genuine RecursionError: recursion without end (what a T5 encoder did to the gpu
    lowering)."""
    return _recurse(*args)


def _raise(error: BaseException):
    def fail(*args, **kwargs):
        raise error
    return fail


def _model(tmp_path, op="Relu") -> str:
    path = tmp_path / f"{op.lower()}.onnx"
    onnx.save(single_op(op, [(4, 37)]), str(path))
    return str(path)


def _internal_line(err: str, phase: str, model: str | None = None) -> re.Match:
    """The one internal-error line of stderr, checked: nothing else of apsat's, no traceback."""
    assert "Traceback" not in err, err
    lines = [li for li in err.splitlines() if li.startswith("apsat: ")]
    assert len(lines) == 1, err
    match = LINE.match(lines[0])
    assert match and match["phase"] == phase and match["model"] == model, lines[0]
    assert len(match["message"] or "") <= InternalError.MAX_DETAIL
    return match


# ---- apsat optimize --------------------------------------------------------------------------

FAULTS = {   # phase -> (module:attribute to patch, its replacement, the exception type the line names)
    "lower": ("apsat.backends.gpu.lower:lower", _recurse, "RecursionError"),
    "saturate": ("apsat.rules.saturate:saturate", _raise(MemoryError()), "MemoryError"),
    "extract": ("apsat.pipeline.optimize:_extract", _raise(KeyError("k" * 5000)), "KeyError"),
    "verify": ("apsat.pipeline.verify:verify_program", _raise(AssertionError("two\nlines")), "AssertionError"),
    "write": ("apsat.backends.gpu.backend:GpuBackend.write", _raise(ZeroDivisionError("oops")), "ZeroDivisionError"),
}


def _patch(monkeypatch, where: str, value) -> None:
    """Patch `module:attr` (or `module:Class.attr`), the module named by its import path:
    a package attribute may shadow a submodule of the same name (apsat.backends.gpu.lower)."""
    module, _, attr = where.partition(":")
    owner = importlib.import_module(module)
    *path, name = attr.split(".")
    for part in path:
        owner = getattr(owner, part)
    monkeypatch.setattr(owner, name, value)


def _recurse_in_lowering(monkeypatch) -> None:
    _patch(monkeypatch, "apsat.backends.gpu.lower:lower", _recurse)


@pytest.mark.parametrize("phase", list(FAULTS))
def test_optimize_reports_an_internal_error_on_one_line_exit_4(tmp_path, capsys, monkeypatch, phase):
    where, replacement, kind = FAULTS[phase]
    _patch(monkeypatch, where, replacement)
    out = tmp_path / "out"
    assert main(["optimize", _model(tmp_path), "--out", str(out)]) == EXIT_INTERNAL_ERROR
    captured = capsys.readouterr()
    line = _internal_line(captured.err, phase)
    assert line["type"] == kind and "\n" not in (line["message"] or "")
    assert Path(line["path"]) == out / "relu" / "traceback.txt"
    text = Path(line["path"]).read_text()
    assert "Traceback (most recent call last)" in text and kind in text
    # inside optimize the original is the InternalError's cause; writing is the CLI's own step
    assert ("InternalError" in text) == (phase != "write")
    assert "internal error" in captured.out            # the summary table's row
    if phase == "extract":                             # a huge repr, cut to one short line
        assert line["message"].endswith("…") and len(line["message"]) == InternalError.MAX_DETAIL
    if phase == "verify":
        assert line["message"] == "two lines"


def test_a_later_success_removes_the_stale_traceback(tmp_path, capsys, monkeypatch):
    out, model = tmp_path / "out", _model(tmp_path)
    with monkeypatch.context() as m:
        _recurse_in_lowering(m)
        assert main(["optimize", model, "--out", str(out), "--no-verify"]) == EXIT_INTERNAL_ERROR
    assert (out / "relu" / "traceback.txt").is_file()
    assert main(["optimize", model, "--out", str(out), "--no-verify"]) == EXIT_OK
    assert not (out / "relu" / "traceback.txt").exists() and (out / "relu" / "report.json").is_file()
    capsys.readouterr()


def test_python_raises_internal_error_naming_the_phase_with_the_original_as_cause(tmp_path, monkeypatch):
    _recurse_in_lowering(monkeypatch)
    phases = []
    with pytest.raises(InternalError) as info:
        apsat.optimize(_model(tmp_path), progress=phases.append)
    error = info.value
    assert not isinstance(error, ApsatError)           # never taken for bad input
    assert (error.phase, error.kind) == ("lower", "RecursionError") and phases[-1] == "lower"
    assert str(error).startswith("internal error in lower: RecursionError: maximum recursion depth")
    assert isinstance(error.__cause__, RecursionError)
    # a Dask result pickles: checked on a copy of the same fields, since pickling the caught
    # error itself recursed once in a full-suite run (right after the RecursionError; cause
    # not found) while it passes alone
    same = InternalError(error.phase, error.kind, error.detail)
    assert str(pickle.loads(pickle.dumps(same))) == str(error)


def test_bad_input_stays_an_apsat_error(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not onnx")
    with pytest.raises(ApsatError):
        apsat.optimize(str(bad))


# ---- commands with no output directory -------------------------------------------------------

def test_extract_writes_its_traceback_to_the_user_log_directory(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))     # platformdirs' log dir on Linux
    _patch(monkeypatch, "apsat.extract:run_extractor", _raise(AssertionError("no choice for class c")))
    graph = tmp_path / "g.json"
    graph.write_text(json.dumps({"nodes": {"a": {"op": "x", "children": [], "eclass": "c", "cost": 1.0}},
                                 "root_eclasses": ["c"]}))
    assert main(["extract", str(graph), "--json"]) == EXIT_INTERNAL_ERROR
    captured = capsys.readouterr()
    line = _internal_line(captured.err, "extract")
    assert captured.out == "" and (line["type"], line["message"]) == ("AssertionError", "no choice for class c")
    path = Path(line["path"])
    if sys.platform.startswith("linux"):
        assert path.parent == tmp_path / "state" / "apsat" / "log"
    assert "no choice for class c" in path.read_text()


def test_rules_internal_error_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    _patch(monkeypatch, "apsat.rules.library:RuleLibrary", _raise(KeyError("fusion")))
    assert main(["rules", "list"]) == EXIT_INTERNAL_ERROR
    line = _internal_line(capsys.readouterr().err, "rules")
    assert (line["type"], line["message"]) == ("KeyError", "'fusion'") and Path(line["path"]).is_file()


def test_an_unwritable_output_directory_falls_back_to_the_log_directory(tmp_path, monkeypatch):
    from apsat.pipeline.internal import internal_failure

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    blocked = tmp_path / "file"
    blocked.write_text("a file where the report directory would be")
    try:
        raise KeyError("x")
    except KeyError as e:
        failure = internal_failure(e, "lower", blocked / "model")
    assert failure["phase"] == "lower" and Path(failure["traceback"]).is_file()
    assert not str(failure["traceback"]).startswith(str(blocked))
    assert failure["error"] == f"internal error in lower: KeyError: 'x' (traceback: {failure['traceback']})"


# ---- apsat zoo --------------------------------------------------------------------------------

def test_zoo_row_table_and_html_of_an_internal_error(tmp_path, capsys, monkeypatch):
    """run_task (what each zoo worker runs) in this process: the other model's row is
    unaffected; report_zoo prints the row's line and exits 4; index.html shows it."""
    from apsat.cli import build_parser
    from apsat.cli.zoo import report_zoo
    from apsat.pipeline.batch import Task, run_task

    out = tmp_path / "out"
    good = run_task(Task("relu", _model(tmp_path, "Relu"), out=str(out)))
    _recurse_in_lowering(monkeypatch)
    bad = run_task(Task("sigmoid", _model(tmp_path, "Sigmoid"), out=str(out)))
    assert good["status"] == "ok"
    assert bad["status"] == "internal error" and bad["error"].startswith("internal error in lower: RecursionError")
    info = bad["internal"]
    assert (info["phase"], info["type"]) == ("lower", "RecursionError")
    assert Path(info["traceback"]) == out / "sigmoid" / "traceback.txt" and Path(info["traceback"]).is_file()
    args = build_parser().parse_args(["zoo", "--out", str(out)])
    assert report_zoo([good, bad], args, _quiet_console()) == EXIT_INTERNAL_ERROR
    captured = capsys.readouterr()
    _internal_line(captured.err, "lower", model="sigmoid")
    table = [li for li in captured.out.splitlines() if "sigmoid" in li]
    assert len(table) == 1 and "internal error" in table[0]
    page = (out / "index.html").read_text()
    assert "1 internal error" in page and 'href="sigmoid/traceback.txt"' in page


def _quiet_console():
    from rich.console import Console

    return Console(file=open(os.devnull, "w"))


SITECUSTOMIZE = '''\
# Test-only: every Python process started with this folder on PYTHONPATH (the zoo's spawned
# workers included) lowers a program holding a sigmoid by recursing without end.
import importlib

_gpu_lower = importlib.import_module("apsat.backends.gpu.lower")   # the module, not the package's lower

_real = _gpu_lower.lower


def _faulty(program, *args, **kwargs):
    if "compute sigmoid" in program.op_counts():
        return _faulty(program, *args, **kwargs)
    return _real(program, *args, **kwargs)


_gpu_lower.lower = _faulty
'''


def test_zoo_workers_report_an_internal_error_while_the_other_model_verifies(tmp_path):
    """The real `apsat zoo`, worker processes and all: the fault reaches the workers through
    a sitecustomize module (monkeypatching this process would not: they are fresh
    interpreters)."""
    models, hook = tmp_path / "models", tmp_path / "hook"
    models.mkdir(), hook.mkdir()
    _model(models, "Relu"), _model(models, "Sigmoid")
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(hook), str(ROOT)])}
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "apsat.cli", "zoo", str(models), "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == EXIT_INTERNAL_ERROR, proc.stderr
    line = _internal_line(proc.stderr, "lower", model="sigmoid")
    assert line["type"] == "RecursionError" and Path(line["path"]) == out / "sigmoid" / "traceback.txt"
    assert "RecursionError" in Path(line["path"]).read_text()
    rows = {li.split()[1]: li for li in proc.stdout.splitlines() if li.split()[1:2] in (["relu"], ["sigmoid"])}
    assert "internal error" in rows["sigmoid"] and " ok " in rows["relu"]
    assert json.loads((out / "relu" / "report.json").read_text())["verification"]["ok"]
    stored = [json.loads(p.read_text())["row"] for p in (out / "results").glob("*.json")]
    assert [r["model"] for r in stored] == ["relu"]     # an internal error is never stored
