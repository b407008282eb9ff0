"""One error contract: public functions raise an ApsatError for bad input, and the command
line prints one line and exits 0 ok, 1 mismatch, 2 bad input, 3 backend failure (4, an
internal error, in tests/test_internal_errors.py). Rulesets are given by name, rule files
by path, and a name never reads the file system."""
import json
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

import apsat
from apsat.cli import EXIT_BACKEND_FAILED, EXIT_BAD_INPUT, EXIT_BROKEN_PIPE, build_parser, main
from apsat.errors import ApsatError, ExtractionError, ModelError, ParseError, RuleError, ShapeError

ROOT = Path(__file__).resolve().parents[1]
OK_GRAPH = {"nodes": {"a": {"op": "x", "children": [], "eclass": "c", "cost": 2.5}},
            "root_eclasses": ["c"], "class_data": {}}


def _write(tmp_path, data, name="g.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def _one_error_line(err: str) -> str:
    assert err.startswith("apsat: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


# ---- apsat extract ---------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["tree", "greedy-dag", "ilp"])
@pytest.mark.parametrize("children, reason", [(["zz"], "needs e-class 'zz', which has no node"),
                                              (["c"], "cycle"), (["a"], "cycle")])
def test_extract_without_a_program_is_one_line_exit_2(tmp_path, capsys, method, children, reason):
    # a child class that does not exist, and a node that is its own child (by class, by node id)
    path = _write(tmp_path, {"nodes": {"a": {"op": "x", "children": children, "eclass": "c"}},
                             "root_eclasses": ["c"]})
    assert main(["extract", path, "--method", method, "--json"]) == EXIT_BAD_INPUT
    out, err = capsys.readouterr()
    assert out == "" and reason in _one_error_line(err) and "root e-class 'c'" in err


@pytest.mark.parametrize("data, words", [
    ({"nodes": {"a": {"op": "x", "children": [], "eclass": "c", "cost": "cheap"}}, "root_eclasses": ["c"]}, "cost"),
    ({"nodes": {"a": {"op": "x", "children": [["b"]], "eclass": "c"}}, "root_eclasses": ["c"]}, "must be ids"),
    ({"nodes": {"a": {"op": "x", "children": [], "eclass": "c"}}}, "no root e-class"),
])
def test_extract_refuses_malformed_files_on_one_line(tmp_path, capsys, data, words):
    assert main(["extract", _write(tmp_path, data)]) == EXIT_BAD_INPUT
    assert words in _one_error_line(capsys.readouterr().err)


def test_extract_of_text_that_is_not_json_is_one_line(tmp_path, capsys):
    path = tmp_path / "g.json"
    path.write_bytes(b"\xff\xfe{")
    assert main(["extract", str(path)]) == EXIT_BAD_INPUT
    assert "not an extraction-gym e-graph" in _one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("method", ["tree", "greedy-dag", "ilp"])
def test_extract_json_prints_exactly_one_json_object(tmp_path, method):
    # a fresh process: HiGHS writes its banner from C on the first solver a process builds
    proc = subprocess.run([sys.executable, "-m", "apsat.cli", "extract", _write(tmp_path, OK_GRAPH),
                           "--method", method, "--json"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)      # the whole of stdout: one object, nothing before or after
    assert result["method"] == method and result["dag_cost"] == 2.5
    assert proc.stdout.count("\n") == 1 and "HiGHS" not in proc.stdout


# ---- models --------------------------------------------------------------------------------

def _no_outputs_model(tmp_path) -> str:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [])
    path = tmp_path / "noout.onnx"
    onnx.save(helper.make_model(graph), str(path))
    return str(path)


def test_a_model_without_outputs_is_refused_on_one_line(tmp_path, capsys):
    path = _no_outputs_model(tmp_path)
    with pytest.raises(ModelError, match="no outputs"):
        apsat.load_onnx(path)
    assert main(["optimize", path, "--out", str(tmp_path / "out")]) == EXIT_BAD_INPUT
    lines = [li for li in capsys.readouterr().err.splitlines() if li.startswith("apsat: noout:")]
    assert len(lines) == 1 and "the graph has no outputs" in lines[0]


def test_a_kernel_that_fails_to_compile_exits_3(tmp_path, capsys, monkeypatch):
    from models import single_op

    from apsat.backends.gpu.backend import GpuBackend

    written = GpuBackend.write

    def failing(self, lowered, directory, compile=False):
        out = written(self, lowered, directory, compile=False)      # sources only: no nvcc here
        if compile:
            out["kernels"][0]["cuda"]["error"] = "relu.cu(7): error: identifier \"q\" is undefined\n1 error"
        return out

    monkeypatch.setattr(GpuBackend, "write", failing)
    model = tmp_path / "relu.onnx"
    onnx.save(single_op("Relu", [(4, 37)]), str(model))
    assert main(["optimize", str(model), "--out", str(tmp_path / "out"), "--no-compile"]) == 0
    capsys.readouterr()
    assert main(["optimize", str(model), "--out", str(tmp_path / "out"), "--compile"]) == EXIT_BACKEND_FAILED
    lines = [li for li in capsys.readouterr().err.splitlines() if li.startswith("apsat: relu: backend:")]
    assert len(lines) == 1 and "1 kernel compile(s) failed" in lines[0] and "identifier" in lines[0]


# ---- flags -----------------------------------------------------------------------------------

def _options(command: str) -> set[str]:
    sub = next(a for a in build_parser()._actions if a.dest == "command").choices[command]
    return {s for a in sub._actions for s in a.option_strings}


def test_optimize_and_zoo_take_the_same_flags_with_the_same_defaults():
    batch = {"--jobs", "--model-timeout", "--max-memory", "--force", "--executor", "--scheduler",
             "--security", "--insecure"}
    assert _options("optimize") - {"--inputs"} == _options("zoo") - batch    # zoo's own: how the batch runs
    assert {"--no-verify", "--compile", "--no-compile", "--rule-file", "--iter-limit", "--node-limit",
            "--time-limit", "--memory-limit", "--no-check-rules"} <= _options("zoo")
    assert "--verify" not in _options("optimize")
    for argv in (["optimize", "m.onnx"], ["zoo"]):
        args = build_parser().parse_args(argv)
        assert args.verify is True and args.compile_kernels is False
    args = build_parser().parse_args(["zoo", "--no-verify", "--compile"])
    assert args.verify is False and args.compile_kernels is True


def test_verify_is_no_longer_a_flag(capsys):
    with pytest.raises(SystemExit) as info:
        main(["optimize", "m.onnx", "--verify"])
    assert info.value.code == EXIT_BAD_INPUT


def test_limits_reach_optimize_only_when_given():
    from apsat.cli import optimize_keywords

    def optimize(model, target="gpu", rules=None, extractor="greedy-dag", verify=True, seed=0,
                 regions=False, lowering=None, iter_limit=None, node_limit=None, time_limit=None):
        """A stand-in without memory_limit and check_rules."""

    parse = build_parser().parse_args
    kw = optimize_keywords(parse(["zoo"]), optimize)
    assert not {"iter_limit", "node_limit", "time_limit", "memory_limit", "check_rules"} & set(kw)
    kw = optimize_keywords(parse(["zoo", "--iter-limit", "5", "--node-limit", "900", "--time-limit", "2.5",
                                  "--seed", "3", "--rules", "fusion", "--rule-file", "mine.egg"]), optimize)
    assert (kw["iter_limit"], kw["node_limit"], kw["time_limit"], kw["seed"]) == (5, 900, 2.5, 3)
    assert kw["rules"] == ["fusion", Path("mine.egg")]
    with pytest.raises(ApsatError, match="--memory-limit, --no-check-rules"):
        optimize_keywords(parse(["zoo", "--memory-limit", "512", "--no-check-rules"]), optimize)

    def newer(model, memory_limit=None, check_rules=True, **kw):
        """A stand-in that takes them."""

    kw = optimize_keywords(parse(["zoo", "--memory-limit", "512", "--no-check-rules"]), newer)
    assert kw["memory_limit"] == 512 and kw["check_rules"] is False


@pytest.mark.parametrize("flag", ["--iter-limit=0", "--node-limit=x", "--time-limit=-1", "--memory-limit=1.5"])
def test_a_bad_limit_is_a_usage_error(flag, capsys):
    with pytest.raises(SystemExit) as info:
        main(["zoo", flag])
    assert info.value.code == EXIT_BAD_INPUT and "is not a positive" in capsys.readouterr().err


def test_inputs_with_no_verify_is_refused(tmp_path, capsys):
    assert main(["optimize", "m.onnx", "--inputs", "in.npz", "--no-verify"]) == EXIT_BAD_INPUT
    assert "drop --no-verify" in _one_error_line(capsys.readouterr().err)


# ---- a closed stdout -------------------------------------------------------------------------

def test_a_closed_pipe_ends_quietly(monkeypatch, capsys):
    import apsat.cli as cli

    def gone(args):
        raise BrokenPipeError

    monkeypatch.setattr(cli, "cmd_rules", gone)      # capsys: no real stdout to point at /dev/null
    assert main(["rules", "list"]) == EXIT_BROKEN_PIPE
    assert capsys.readouterr().err == ""


def test_rules_list_into_a_closed_pipe_prints_no_traceback():
    proc = subprocess.Popen([sys.executable, "-m", "apsat.cli", "rules", "list"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()                   # the reader is gone before apsat writes a line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == EXIT_BROKEN_PIPE and err == ""


# ---- names and paths -------------------------------------------------------------------------

def test_a_ruleset_name_is_a_name_even_beside_a_folder_of_that_name(tmp_path, monkeypatch):
    from apsat.rules.library import RuleLibrary

    monkeypatch.chdir(tmp_path)
    (tmp_path / "fusion").mkdir()
    (tmp_path / "mine").write_text("; not egglog\n")
    lib = RuleLibrary()
    assert lib.resolve(["fusion"]) == ["fusion"]
    with pytest.raises(RuleError, match=r"\./fusion: no rules to run \(the directory holds no .egg file\)"):
        lib.resolve(["./fusion"])
    with pytest.raises(RuleError, match="unknown ruleset 'mine'.*give it as --rule-file mine or ./mine"):
        lib.resolve(["mine"])
    with pytest.raises(RuleError, match="file declares no ruleset and no rule"):
        lib.resolve(files=["mine"])
    (tmp_path / "fusion" / "more.egg").write_text(
        '(ruleset more)\n(rewrite (compute (relu) (compute (relu) x)) (compute (relu) x) :ruleset more)\n')
    assert lib.resolve(["fusion"], files=["fusion"]) == ["fusion", "more"]
    assert lib.resolve(["fusion/more.egg", Path("fusion")]) == ["more"]


def test_optimize_rules_fusion_runs_the_builtin_ruleset_beside_a_fusion_folder(tmp_path, monkeypatch):
    import models

    monkeypatch.chdir(tmp_path)
    (tmp_path / "fusion").mkdir()
    onnx.save(models.conv_batchnorm(), "cbr.onnx")
    assert main(["optimize", "cbr.onnx", "--rules", "fusion", "--no-verify"]) == 0
    report = json.loads((tmp_path / "apsat-out" / "cbr" / "report.json").read_text())
    (phase,) = report["saturation"]["phases"]
    assert phase["rulesets"] == ["fusion"] and sum(phase["rule_matches"].values()) > 0


# ---- the Python API --------------------------------------------------------------------------

def test_public_functions_raise_apsat_errors_for_bad_input(tmp_path):
    from apsat.extract.check import InvalidExtraction, check_extraction
    from apsat.extract.graph import ExtractionGraph

    with pytest.raises(ParseError):
        apsat.parse(None, {})
    with pytest.raises(ShapeError, match="dims must be non-negative ints"):
        apsat.parse("(access-tensor w)", {"w": (-1, 2)})
    eg = apsat.EGraph()
    root = eg.add(apsat.parse("(compute relu (access-tensor w))", {"w": (2, 3)}))
    for kwargs, words in [({"method": "best"}, "unknown extraction method"), ({"cost": "tpu"}, "unknown cost model")]:
        with pytest.raises(ExtractionError, match=words) as info:
            apsat.extract(eg, root, **kwargs)
        assert isinstance(info.value, ValueError)      # as before they were ApsatErrors
    with pytest.raises(ExtractionError, match="no root"):
        apsat.extract(eg, {})
    graph = ExtractionGraph.from_json(OK_GRAPH)
    with pytest.raises(InvalidExtraction) as info:
        check_extraction(graph, {}, ["c"])
    assert isinstance(info.value, ApsatError)
    with pytest.raises(ExtractionError, match="not JSON"):
        ExtractionGraph.from_json("{nodes")
