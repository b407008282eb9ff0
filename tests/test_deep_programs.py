"""Deep and large programs: nothing proportional to a program's depth on the Python stack,
and every writer linear in its output.

Each model is built here with onnx.helper and pushed through `apsat optimize MODEL
--target T --out DIR --onnx-out F` (the CLI entry point, in a child process at Python's
default recursion limit of 1000): import, saturation (limited, see below), extraction, the
target's backend (gpu: the kernel graph and its Triton and CUDA C sources; systolic:32x32:
the instruction stream and its simulator), verification against onnxruntime with the
reference interpreter, the ONNX export, program.txt and report.json; then the child reads
program.txt back and writes the zoo's index.html from the report.

Budgets. A child's peak resident memory (getrusage(RUSAGE_CHILDREN).ru_maxrss of a
wrapper process that runs only that child, so other tests' children do not count) must
stay under MEMORY_BUDGET: importing apsat with egglog, onnxruntime and numpy is about
0.5 GiB, and every run measured here peaks under 0.9 GiB, while what these tests guard
against is far above it: program.txt of a 5,000-deep chain took 6.9 GiB (to_dag_text
copied the chain's text once a level) and greedy-DAG extraction kept every class's set
(4.4 GiB on the 10,000-node DAG). Saturation runs one iteration a phase (--iter-limit 1)
so that each run stays well under a minute on 2 cores; that is enough to pass every phase.

Models (depth counted in ONNX nodes; the language has 2 to 4 terms a node):
  * an element-wise chain y = ((x + c0) * c1 - c2) ... 5,000 nodes deep, which the gpu
    target fuses into one kernel 5,000 operations deep;
  * a layout chain of 5,000 nodes: Slice, Slice, Concat, repeated (the importer keeps it; a
    Transpose chain it folds into one transpose, so that is no deep program);
  * a gather's chain: y = x + the concatenation of 5,000 one-row slices of a weight table,
    left-nested binary Concats, as a Gather with constant indices used to be lowered;
  * Swin's relative-position bias, y = x + Gather(table, idx) with idx the 25x25 index of
    a 5x5 window (failure (a): the slices + concats lowering made the gpu lowering recurse);
  * a DAG of 10,000 nodes: x fans out to 10 lanes of 200 diamonds each (every value read by
    a relu, a scale and a shift, merged by an add and a sub), summed at the end.
"""
import json
import subprocess
import sys
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

MEMORY_BUDGET_MIB = 2048
TIME_BUDGET_S = 120           # per run, far above the ~10-40 s measured: a hang, not a slow machine
DEPTH = 5000
TARGETS = ("gpu", "systolic:32x32")

# The child: the CLI, then program.txt read back and index.html written; one JSON line last.
CHILD = r"""
import json, sys, time
from pathlib import Path
assert sys.getrecursionlimit() == 1000, sys.getrecursionlimit()
from apsat.cli import main
model, target, out, extra = sys.argv[1], sys.argv[2], Path(sys.argv[3]), json.loads(sys.argv[4])
start = time.perf_counter()
status = main(["optimize", model, "--target", target, "--out", str(out),
               "--onnx-out", str(out / "optimized.onnx"), *extra])
result = {"status": status, "cli_seconds": time.perf_counter() - start}
name = Path(model).stem
if status == 0:
    from apsat.lang.syntax import parse_dag_text
    from apsat.pipeline.batch import summary
    from apsat.pipeline.report_html import write_report
    report = json.loads((out / name / "report.json").read_text())
    outputs = parse_dag_text((out / name / "program.txt").read_text())
    html = write_report([{"model": name, **summary(report)}], out)
    result.update(ops_after=report["ops_after"], outputs=sorted(outputs), html=html.stat().st_size,
                  verification=report["verification"], backend=report.get("gpu_kernels") or report.get("systolic"),
                  program_bytes=(out / name / "program.txt").stat().st_size)
print("RESULT " + json.dumps(result, default=str))
"""
# Runs the child alone and reports its peak resident memory (KiB on Linux).
WRAPPER = ("import json, resource, subprocess, sys; r = subprocess.run(sys.argv[1:]); "
           "print('RSS ' + json.dumps([r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss]))")


def _model(nodes, inits, x_dims, y_dims, name, extra_inputs=()):
    """A float32 model x -> y of opset 17."""
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_dims), *extra_inputs]
    graph = helper.make_graph(nodes, name, inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_dims)],
                              initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def elementwise_chain(n, dims=(4, 8)):
    """y = ((x + c0) * c1 - c2) ...: n element-wise nodes, each with its own constant row."""
    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for i in range(n):
        op = ("Add", "Mul", "Sub")[i % 3]
        value = rng.uniform(0.9, 1.1, dims[-1:]) if op == "Mul" else rng.uniform(-0.01, 0.01, dims[-1:])
        inits.append(numpy_helper.from_array(value.astype(np.float32), f"c{i}"))
        nodes.append(helper.make_node(op, [prev, f"c{i}"], ["y" if i == n - 1 else f"t{i}"]))
        prev = f"t{i}"
    return _model(nodes, inits, dims, dims, "elementwise_chain")


def layout_chain(n, dims=(4, 8)):
    """About n nodes: t = Concat(Slice(t, cols 0:h), Slice(t, cols h:w)) repeated, then a Relu."""
    h, w = dims[1] // 2, dims[1]
    inits = [numpy_helper.from_array(np.array([v], np.int64), name) for name, v in
             (("zero", 0), ("half", h), ("width", w), ("axis", 1))]
    nodes, prev = [], "x"
    for k in range(n // 3):
        nodes += [helper.make_node("Slice", [prev, "zero", "half", "axis"], [f"a{k}"]),
                  helper.make_node("Slice", [prev, "half", "width", "axis"], [f"b{k}"]),
                  helper.make_node("Concat", [f"a{k}", f"b{k}"], [f"c{k}"], axis=1)]
        prev = f"c{k}"
    nodes.append(helper.make_node("Relu", [prev], ["y"]))
    return _model(nodes, inits, dims, dims, "layout_chain")


def concat_chain(rows, table_rows=81, width=3):
    """y = x + the left-nested binary Concat of `rows` one-row Slices of a weight table
    (how a Gather with constant indices was lowered: 2 * rows - 1 nodes deep)."""
    rng = np.random.default_rng(1)
    table = rng.standard_normal((table_rows, width)).astype(np.float32)
    inits = [numpy_helper.from_array(table, "table"), numpy_helper.from_array(np.array([0], np.int64), "axis")]
    nodes, prev = [], None
    for k, r in enumerate(rng.integers(0, table_rows, rows)):
        inits += [numpy_helper.from_array(np.array([r], np.int64), f"lo{k}"),
                  numpy_helper.from_array(np.array([r + 1], np.int64), f"hi{k}")]
        nodes.append(helper.make_node("Slice", ["table", f"lo{k}", f"hi{k}", "axis"], [f"s{k}"]))
        if prev is not None:
            nodes.append(helper.make_node("Concat", [prev, f"s{k}"], [f"c{k}"], axis=0))
        prev = f"s{k}" if prev is None else f"c{k}"
    nodes.append(helper.make_node("Add", ["x", prev], ["y"]))
    return _model(nodes, inits, (rows, width), (rows, width), "concat_chain")


def window_bias(window=5, heads=3, table_is_input=False):
    """y = x + Gather(table, idx): Swin's relative-position bias of a window x window
    window, table ((2w-1)^2, heads), idx the (w^2, w^2) relative-position index. The table
    is a weight, or (table_is_input) a second input, which no importer can fold away."""
    w = window
    table = np.random.default_rng(2).standard_normal(((2 * w - 1) ** 2, heads)).astype(np.float32)
    coords = np.stack(np.meshgrid(np.arange(w), np.arange(w), indexing="ij")).reshape(2, -1)
    rel = (coords[:, :, None] - coords[:, None, :]).transpose(1, 2, 0) + (w - 1)
    idx = (rel[..., 0] * (2 * w - 1) + rel[..., 1]).astype(np.int64)
    inits = [numpy_helper.from_array(idx, "idx")] + ([] if table_is_input else [numpy_helper.from_array(table, "table")])
    extra = [helper.make_tensor_value_info("table", TensorProto.FLOAT, table.shape)] if table_is_input else []
    nodes = [helper.make_node("Gather", ["table", "idx"], ["g"], axis=0), helper.make_node("Add", ["x", "g"], ["y"])]
    return _model(nodes, inits, (w * w, w * w, heads), (w * w, w * w, heads), "window_bias", extra)


def lanes_dag(n_nodes, n_lanes=10, dims=(4, 8)):
    """About n_nodes nodes: x fans out to n_lanes chains of diamonds (each level reads its
    value three times: a relu, a scale, a shift, merged by an add and a sub), then a sum."""
    rng = np.random.default_rng(3)
    nodes, inits, ends, k = [], [], [], 0
    for _ in range(n_lanes):
        prev = "x"
        for _ in range((n_nodes // n_lanes - 1) // 5):
            inits += [numpy_helper.from_array(rng.uniform(0.2, 0.3, dims[-1:]).astype(np.float32), f"s{k}"),
                      numpy_helper.from_array(rng.uniform(-0.1, 0.1, dims[-1:]).astype(np.float32), f"b{k}")]
            nodes += [helper.make_node("Relu", [prev], [f"r{k}"]),
                      helper.make_node("Mul", [prev, f"s{k}"], [f"m{k}"]),
                      helper.make_node("Add", [prev, f"b{k}"], [f"a{k}"]),
                      helper.make_node("Add", [f"r{k}", f"m{k}"], [f"p{k}"]),
                      helper.make_node("Sub", [f"p{k}", f"a{k}"], [f"d{k}"])]
            prev, k = f"d{k}", k + 1
        ends.append(prev)
    for i, end in enumerate(ends[1:]):
        nodes.append(helper.make_node("Add", [ends[0] if i == 0 else f"sum{i - 1}", end], [f"sum{i}"]))
    nodes.append(helper.make_node("Tanh", [f"sum{len(ends) - 2}"], ["y"]))
    return _model(nodes, inits, dims, dims, "lanes_dag")


def optimize_in_child(model, target, tmp_path, *extra) -> dict:
    """Save `model`, run CHILD on it for `target` with the CLI flags `extra`, and return its
    result with "peak_mib" (the child's peak resident memory) and "wall_s"; fails the test
    on a non-zero status (with the child's stderr), over MEMORY_BUDGET_MIB or over
    TIME_BUDGET_S."""
    onnx.checker.check_model(model)
    path = tmp_path / f"{model.graph.name}.onnx"
    onnx.save(model, str(path))
    out = tmp_path / "out"
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", WRAPPER, sys.executable, "-c", CHILD, str(path), target, str(out),
                           json.dumps(list(extra))], capture_output=True, text=True, timeout=TIME_BUDGET_S)
    wall = time.perf_counter() - start
    lines = proc.stdout.splitlines()
    rc, rss_kib = json.loads(next(ln[4:] for ln in lines if ln.startswith("RSS ")))
    results = [json.loads(ln[7:]) for ln in lines if ln.startswith("RESULT ")]
    assert rc == 0 and results and results[0]["status"] == 0, \
        f"{model.graph.name} on {target}: exit {rc}\n{proc.stderr[-4000:]}"
    result = {**results[0], "peak_mib": rss_kib / 1024, "wall_s": wall}
    print(f"{model.graph.name} {target}: {wall:.1f} s wall, peak {result['peak_mib']:.0f} MiB")
    assert result["peak_mib"] < MEMORY_BUDGET_MIB, result
    return result


def _check(result, deep_op=None, at_least=0):
    """The run verified, read program.txt back, wrote index.html, and (deep_op) the
    extracted program kept at least `at_least` of that op, so the backends met the depth."""
    assert result["verification"]["ok"], result["verification"]
    assert result["outputs"] == ["y"] and result["html"] > 0
    if deep_op is not None:
        assert result["ops_after"].get(deep_op, 0) >= at_least, result["ops_after"]
    backend = result["backend"]
    run = backend.get("simulation") or backend.get("run") or {}
    assert run.get("ok", True) is not False, run


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
def test_elementwise_chain_5000_deep(tmp_path, target):
    """A 5,000-node element-wise chain (one 5,000-operation kernel on the gpu target)."""
    result = optimize_in_child(elementwise_chain(DEPTH), target, tmp_path, "--iter-limit", "1")
    _check(result, "access-pair", DEPTH)


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
def test_layout_chain_5000_deep(tmp_path, target):
    """Slice, Slice, Concat, 5,000 nodes deep: saturated with the fusion rules only (the
    layout rules fold each Concat of its two Slices away, and then no deep program is left
    for the backends)."""
    result = optimize_in_child(layout_chain(DEPTH), target, tmp_path, "--rules", "fusion", "--iter-limit", "1")
    _check(result, "access-concatenate", DEPTH // 3)


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
def test_concat_chain_5000_deep(tmp_path, target):
    """A gather's slices and concats, 4,999 concatenations deep, read inside one kernel."""
    result = optimize_in_child(concat_chain(DEPTH), target, tmp_path, "--iter-limit", "1")
    _check(result, "access-concatenate", DEPTH - 1)


@pytest.mark.slow
@pytest.mark.parametrize("target", TARGETS)
def test_dag_of_10000_nodes(tmp_path, target):
    """10 lanes of 200 diamonds from one input, summed: 10,000 nodes, every value read
    three times (the fusion rules turn each relu and the sub before it into one chain)."""
    result = optimize_in_child(lanes_dag(10_000), target, tmp_path, "--iter-limit", "1")
    _check(result, "access-pair", 7000)


@pytest.mark.parametrize("table_is_input", [False, True])
def test_window_bias_gather(tmp_path, table_is_input):
    """Failure (a): y = x + Gather(table, idx) over a 5x5 window's 25x25 relative-position
    index (Swin). With the table a weight the importer may fold the gather into a weight;
    as an input it stays a gather (slices and concats, or a gather construct)."""
    result = optimize_in_child(window_bias(table_is_input=table_is_input), "gpu", tmp_path)
    _check(result)


def _lower_at_low_recursion_limit(program, limit=400):
    """The gpu kernel graph of `program` and its Triton and CUDA C sources, built with the
    recursion limit at `limit` (pytest's own frames included): a walk that follows the
    program's depth fails here long before it would at 1000."""
    from apsat.backends.gpu.lower import lower
    from apsat.backends.gpu.cuda import kernel_source as cuda_source
    from apsat.backends.gpu.triton import kernel_source as triton_source

    old = sys.getrecursionlimit()
    sys.setrecursionlimit(limit)
    try:
        graph = lower(program)
        return graph, [(triton_source(k), cuda_source(k)) for k in graph.kernels]
    finally:
        sys.setrecursionlimit(old)


def test_concat_chain_lowers_without_recursion():
    """The gpu lowering reads a 2,000-deep chain of concatenations (slices of a weight,
    joined as a Gather with constant indices was lowered) in one kernel, at a recursion
    limit of 400, whatever the importer does with Gather; each load keeps at most two bounds
    (not one per enclosing concatenation: kernel text quadratic in the depth)."""
    from apsat import load_onnx

    program = load_onnx(concat_chain(1000)).program
    assert program.op_counts()["access-concatenate"] == 999
    graph, sources = _lower_at_low_recursion_limit(program)
    assert not graph.host_steps and len(graph.kernels) == 1
    triton, cuda = sources[0]
    assert triton.count("tl.load(table_ptr") == 1000
    assert max(ln.count(" & ") for ln in triton.splitlines() if "tl.load(" in ln) <= 2
    assert len(cuda) < 400_000 and len(triton) < 400_000


def test_elementwise_chain_lowers_without_recursion():
    """A 3,000-node element-wise chain is one gpu kernel 3,000 operations deep, built and
    written at a recursion limit of 400; its value expression hashes and compares without
    recursing (expr.Node)."""
    from apsat import load_onnx
    from apsat.backends.gpu.expr import value_nodes

    program = load_onnx(elementwise_chain(3000)).program
    graph, sources = _lower_at_low_recursion_limit(program)
    (kernel,) = graph.kernels
    value = kernel.values["out"]
    assert len(value_nodes(value)) > 3000
    again = _lower_at_low_recursion_limit(program)[0].kernels[0].values["out"]
    assert again is not value and again == value and hash(again) == hash(value)
    assert sources[0][0].count("\n") > 3000


def test_shuffling_reshape_chain_copies_out_instead_of_growing_its_index():
    """300 Transpose + Reshape pairs that shuffle a (4, 6) tensor each time: read inline,
    the index expression would double with every pair (a 40-deep chain wrote a 600 KB
    load). Past views.INDEX_LIMIT nodes the operand is copied into a buffer of its own, so
    the chain becomes copies of bounded index size, at a recursion limit of 400, and the
    Triton kernels equal the reference interpreter exactly (copies move values)."""
    import apsat
    from apsat.backends.gpu.runner import run_kernels
    from apsat.backends.gpu.views import INDEX_LIMIT
    from apsat.lang.evaluate import evaluate

    t = "(access-tensor x)"
    for _ in range(300):
        t = f"(access-reshape (access-transpose {t} (list 1 0)) (access-shape (shape 4 6) (shape)))"
    program = apsat.parse(f"(compute relu {t})", {"x": (4, 6)})
    graph, sources = _lower_at_low_recursion_limit(program)
    assert not graph.host_steps and 20 < len(graph.kernels) < 300
    assert max(len(triton) for triton, _ in sources) < 40 * INDEX_LIMIT
    x = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    got = run_kernels(program, {"x": x})
    got = next(iter(got.values())) if isinstance(got, dict) else got
    np.testing.assert_array_equal(np.asarray(got.numpy() if hasattr(got, "numpy") else got),
                                  evaluate(program, {"x": x}))


def test_program_text_is_linear_in_its_size():
    """to_dag_text of a 5,000-deep chain allocates a small multiple of the text it writes
    (it used to hold every level's text: quadratic, 6.9 GiB for a 1.5 MB program.txt), and
    parse_dag_text and to_text read and write it at the default recursion limit."""
    import tracemalloc

    from apsat import load_onnx
    from apsat.lang.syntax import parse_dag_text, to_dag_text, to_text

    program = load_onnx(elementwise_chain(DEPTH)).program
    tracemalloc.start()
    text = to_dag_text(program.outputs)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(text) > 800_000 and peak < 10 * len(text)
    assert parse_dag_text(text) == program.outputs
    assert to_text(program.outputs["y"]) == text.split("output y = ", 1)[1].rstrip("\n")
