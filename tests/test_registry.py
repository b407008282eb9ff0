"""The op registry (apsat/lang/ops.py) against every part that must cover each op.

Adding an op is one registry entry plus the importer's mapping; everything else is derived
from the entry or must handle it as it is. This test walks the registry through each part
and fails naming the op and the part that lacks it: the egglog declaration, shape rule and
classification; the reference semantics; the workload role and arithmetic, and both cost
models; the importer; the GPU backend (expression IR, Triton and CUDA C source, Triton
numerics under the interpreter); the systolic backend (vector unit, simulator, cycles).
"""
import numpy as np
import pytest

import apsat
from apsat.egraph.egglog_io import language_text
from apsat.lang import egg_gen
from apsat.lang import formula as fm
from apsat.lang.ops import (ACTIVATIONS, COMPUTE_OPS, EGG_NAMES, NARY_OPS, OPS, PAD_TYPES,
                            UNARY_MAPS)
from apsat.lang.spec import ROLES
from apsat.lang.syntax import _read_sexprs
from fresh import fresh_egraph
from test_syntax import EXAMPLES, SHAPES, operator_head

# Samples take square roots and powers of negative numbers: nan, in every part alike.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
LANGUAGE = "language.egg / shape_rules.egg"
OPERATORS = sorted(COMPUTE_OPS)


def _forms():
    """Top-level forms of the language's egglog text as (head, set of atoms anywhere inside)."""
    out = []
    for form in _read_sexprs(language_text()):
        if not isinstance(form, list) or not form:
            continue
        atoms, stack = set(), [form]
        while stack:
            node = stack.pop()
            if isinstance(node, list):
                stack.extend(node)
            else:
                atoms.add(node[0])
        out.append((form[0][0] if not isinstance(form[0], list) else "", atoms))
    return out


def sample(op: str) -> tuple[str, dict]:
    """A program applying compute operator `op` (sample parameters) and its tensor shapes:
    over a pair of ((5), (4)) accesses when it takes two operands, else over a ((5), (n, 4))
    access. Tensor names tell the shapes apart, so samples can share an e-graph."""
    spec = COMPUTE_OPS[op]
    pairwise = spec.kind == "contraction" or op == "chain" or (spec.kind == "nary" and spec.arity in (0, 2))
    if pairwise:
        return (f"(compute {operator_head(op)} (access-pair (access (access-tensor ap) 1) "
                f"(access (access-tensor bp) 1)))", {"ap": (5, 4), "bp": (5, 4)})
    n = spec.arity if spec.kind == "nary" else 2
    return f"(compute {operator_head(op)} (access (access-tensor a{n}) 1))", {f"a{n}": (5, n, 4)}


def _inputs(program, seed=0) -> dict:
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(program.tensor_shapes[n]).astype(np.float32)
            for n in program.tensor_names()}


def _example(op: str) -> str:
    """The first test_syntax example using Expr op `op`."""
    return next(t for t in EXAMPLES if op in {u.op for u in apsat.parse(t, SHAPES).terms()})


# ---- egglog: declarations, shape rules, classification --------------------------------------

DECLARING = {"datatype", "datatype*", "constructor", "sort"}


@pytest.mark.parametrize("name", sorted(set(OPS) | set(COMPUTE_OPS) | set(PAD_TYPES)))
def test_declared_in_language_egg(name):
    name = EGG_NAMES.get(name, name)
    assert any(head in DECLARING and name in atoms for head, atoms in _forms()), \
        f"{name} has no egglog declaration in {LANGUAGE}"


@pytest.mark.parametrize("name", sorted(OPS))
def test_every_op_has_an_egglog_shape_rule(name):
    assert any(head == "rule" and name in atoms for head, atoms in _forms()), \
        f"{name} has no shape rule in {LANGUAGE}"


@pytest.mark.parametrize("name", OPERATORS)
def test_every_compute_operator_has_an_egglog_shape_rule(name):
    name = EGG_NAMES.get(name, name)
    assert any(head == "rule" and name in atoms for head, atoms in _forms()), \
        f"compute operator {name} has no shape rule in {LANGUAGE}"


def test_generated_sections_are_each_placed_once():
    """Every section egg_gen generates has exactly one marker line in the language files."""
    from apsat.egraph.egglog_io import LANGUAGE_FILES

    text = "\n".join(f.read_text() for f in LANGUAGE_FILES)
    placed = [m.group(1) for m in egg_gen.MARKER.finditer(text)]
    assert sorted(placed) == sorted(egg_gen.SECTIONS), f"markers {placed} in {LANGUAGE}"


def test_element_wise_operator_sets_agree_with_language_egg():
    """The operators language.egg marks `unary-map`, `item-nary` and `activation` are
    exactly the registry's UNARY_MAPS, NARY_OPS and ACTIVATIONS."""
    names = {EGG_NAMES.get(c, c) for c in COMPUTE_OPS} - {"chain"}

    def classified(relation):     # the one-operator classification rules asserting `relation`
        return {name for head, atoms in _forms() if head == "rule" and relation in atoms
                and len(atoms & names) == 1 for name in atoms & names}

    assert classified("unary-map") == {EGG_NAMES.get(c, c) for c in UNARY_MAPS}
    assert classified("item-nary") == set(NARY_OPS)
    assert classified("activation") == set(ACTIVATIONS)


@pytest.mark.parametrize("op", OPERATORS)
def test_egglog_derives_each_operators_shape_as_python_does(op):
    text, shapes = sample(op)
    program = apsat.parse(text, shapes)
    eg = fresh_egraph(seed_every=0)
    assert eg.shape_of(eg.add(program)) == program.shape, \
        f"{op}: egglog's shape rules (generated classification) disagree with shapes.item_shape"


@pytest.mark.parametrize("op", sorted(o for o in COMPUTE_OPS if COMPUTE_OPS[o].kind == "item"))
def test_whole_item_operators_are_refused_inside_chains(op):
    """egglog cannot ask "not an element-wise operator": the generated classification
    marks each whole-item operator `item-whole` (with its name), and shape_rules.egg's
    chain rules flag it as a chain's F and as its G, naming it."""
    from apsat.egraph.driver import egg_term
    from apsat.errors import ShapeError
    from apsat.lang.syntax import parse_term
    from apsat.lang.term import Term

    assert any(head == "rule" and {"item-whole", EGG_NAMES.get(op, op)} <= atoms for head, atoms in _forms())
    x = "(access (access-tensor x) 1)"
    for side, chain in (("F", f"(chain {operator_head(op)} relu)"), ("G", f"(chain relu {operator_head(op)})")):
        eg = fresh_egraph()
        eg.add(Term("access-tensor", ("x",)), shapes={"x": (3, 4, 5)})
        with pytest.raises(ShapeError, match=f"the chain's {side} is {op}, not element-wise"):
            eg.load_text(f"(let $bad {egg_term(parse_term(f'(compute {chain} {x})'))})")


# ---- reference semantics --------------------------------------------------------------------

def test_reference_semantics_cover_the_registry():
    from apsat.lang.evaluate import COMPUTE_EVALUATORS, EVALUATORS

    assert set(EVALUATORS) == set(OPS), f"evaluate.EVALUATORS lacks {set(OPS) - set(EVALUATORS)}"
    assert set(COMPUTE_EVALUATORS) == set(COMPUTE_OPS)


@pytest.mark.parametrize("op", sorted(o for o in COMPUTE_OPS if COMPUTE_OPS[o].scalar is not None))
def test_explicit_semantics_agree_with_the_formula(op):
    """An operator with its own evaluator (np.clip) computes what its formula says (the
    GPU's reading), up to the sign of a zero."""
    from apsat.lang.semantics import NUMPY

    spec = COMPUTE_OPS[op]
    params = spec.example_params()
    x = np.random.default_rng(1).standard_normal((4, spec.arity or 2, 6)).astype(np.float32)
    operands = (x,) if spec.kind == "map" else tuple(x[:, i] for i in range(x.shape[1]))
    with np.errstate(all="ignore"):
        want = fm.interpret(spec.scalar, operands, params, NUMPY)
        got = spec.evaluate(x, 1, params)
    np.testing.assert_array_equal(got, want, err_msg=f"{op}: evaluate and scalar formula differ")


# ---- workload, arithmetic, cost models ------------------------------------------------------

def test_every_op_has_a_role_and_kernels_their_arithmetic():
    for name, spec in OPS.items():
        assert spec.role in ROLES, f"{name}: role {spec.role!r}"
        assert (spec.flops is None) == (spec.role not in ("compute", "atom")), f"{name}: flops"
    for name, spec in COMPUTE_OPS.items():
        assert bool(spec.flops_in) + bool(spec.flops_out) == (name != "chain"), f"{name}: FLOP figure"


def _priced_examples():
    """An e-graph holding one program per op and per compute operator, serialised with its
    class shapes, as cost models see it."""
    from apsat.explore.egraph import EGraph
    from apsat.extract.decode import language_graph
    from apsat.lang.syntax import parse_term

    eg = EGraph()
    for text in EXAMPLES:
        eg.add(parse_term(text), SHAPES)
    for op in COMPUTE_OPS:
        text, shapes = sample(op)
        eg.add(parse_term(text), shapes)
    return language_graph(eg.serialize())      # carries egglog's class shapes


@pytest.mark.parametrize("model", ["nodes", "gpu", "systolic"])
def test_every_cost_model_prices_every_op(model):
    from apsat.extract.cost import COST_MODELS, cost_model

    assert model in COST_MODELS
    graph = _priced_examples()
    cost = cost_model(model).node_cost(graph)
    seen_ops, seen_operators = set(), set()
    for nid, node in graph.nodes.items():
        value = cost(nid)
        assert 0 <= value < float("inf"), f"cost model {model} prices {node['op']} at {value}"
        seen_ops.add(node["op"])
        if node["op"] == "compute":
            seen_operators.add(graph.nodes[graph.classes[graph.node_classes[nid][0]][0]]["op"])
    assert set(OPS) <= seen_ops
    assert {EGG_NAMES.get(c, c) for c in COMPUTE_OPS} <= {EGG_NAMES.get(c, c) for c in seen_operators}


def test_chain_arithmetic_is_the_sum_of_its_parts():
    from apsat.lang.arithmetic import operator_flops
    from apsat.lang.ops import FLOPS_PER_INPUT, FLOPS_PER_OUTPUT
    from apsat.lang.syntax import parse_compute_op

    op = parse_compute_op("(chain (chain elementwise-add relu) sigmoid)")
    n = 100
    want = FLOPS_PER_INPUT["elementwise-add"] * 2 * n + (FLOPS_PER_OUTPUT["relu"] + FLOPS_PER_OUTPUT["sigmoid"]) * n
    assert operator_flops(op, 2 * n, n) == want


# ---- importer -------------------------------------------------------------------------------

def test_importer_entries_exist():
    from apsat.frontend.lowering import LOWERINGS

    for spec in list(OPS.values()) + list(COMPUTE_OPS.values()):
        if isinstance(spec.onnx, str):
            assert spec.onnx.strip(), f"{spec.name}: no importer entry and no reason why"
            continue
        for onnx_op in spec.onnx:
            if not onnx_op.startswith("<"):
                assert onnx_op in LOWERINGS, f"{spec.name} names ONNX {onnx_op}, which has no lowering"


def test_operator_parameter_kinds_are_known():
    """ComputeSpec.params are literal kinds or operators (chain's F and G); syntax,
    egglog text and decode handle exactly these."""
    for spec in COMPUTE_OPS.values():
        assert set(spec.params) <= {"int", "float", "compute-op"}, spec.name
    assert COMPUTE_OPS["chain"].params == ("compute-op", "compute-op")


# ---- GPU backend ----------------------------------------------------------------------------

@pytest.mark.parametrize("fn", sorted(fm.FUNCTIONS))
def test_gpu_renders_every_formula_function(fn):
    """The registry formulas' functions are the GPU expression IR's. Both dialects write
    each (Triton through a helper of its own where tl has none); a function the primitive
    table defines for kernels (max, min) each writes as a function of that definition's
    comparisons and selects, never with an instruction of its own."""
    from apsat.backends.gpu import expr
    from apsat.backends.gpu.cuda import CudaDialect
    from apsat.backends.gpu.triton import HELPERS, TritonDialect
    from apsat.lang.primitives import PRIMITIVES

    assert fn in (expr.UNARY if fm.FUNCTIONS[fn] == 1 else expr.BINARY), f"formula function {fn}: not in the GPU IR"
    args = ["a", "b"][: fm.FUNCTIONS[fn]]
    triton = TritonDialect("mask")
    if PRIMITIVES[fn].kernel is not None:
        # both dialects call a function written from the table's definition, never
        # tl.maximum / fmaxf (which drop NaN)
        from apsat.backends.gpu.cuda import DEVICE_FUNCTIONS

        assert triton.call(fn, args) == f"_{fn}(a, b)" and "tl.where" in HELPERS[fn]
        assert CudaDialect().call(fn, args) == f"apsat_{fn}(a, b)" and f"float apsat_{fn}(" in DEVICE_FUNCTIONS
        assert "maximum" not in HELPERS[fn] and "fmaxf" not in DEVICE_FUNCTIONS
        return
    assert triton.call(fn, args) and triton.helpers <= set(HELPERS), f"{fn}: Triton helper missing"
    try:
        CudaDialect().call(fn, args)
    except KeyError:
        pytest.fail(f"formula function {fn}: no CUDA C spelling (CudaDialect.call)")


def _gpu_host_steps(program) -> tuple[list, list]:
    """(host steps run by the reference interpreter, kernels) of the GPU lowering."""
    from apsat.backends.gpu.graph import HostStep
    from apsat.backends.gpu.lower import lower

    graph = lower(program)
    return [s for s in graph.steps if isinstance(s, HostStep) and s.runner == "reference"], graph.kernels


@pytest.mark.parametrize("op", OPERATORS)
def test_gpu_generates_kernels_for_every_operator(op):
    from apsat.backends.gpu import cuda, triton

    host, kernels = _gpu_host_steps(apsat.parse(*sample(op)))
    assert not host, f"{op}: the GPU backend runs it on the host ({host[0].reason})"
    for k in kernels:
        assert "def " in triton.kernel_source(k), f"{op}: no Triton source"
        assert "__global__" in cuda.kernel_source(k)[0], f"{op}: no CUDA C source"


@pytest.mark.parametrize("op", sorted(set(OPS) - {"opaque"}))
def test_gpu_generates_kernels_for_every_op(op):
    host, _ = _gpu_host_steps(apsat.parse(_example(op), SHAPES))
    assert not host, f"{op}: the GPU backend runs it on the host ({host[0].reason})"


def test_gpu_element_wise_kernels_equal_the_reference():
    """Every element-wise operator, one kernel each, under the Triton interpreter (or on
    the GPU) equals the reference interpreter."""
    pytest.importorskip("torch", reason="the GPU backend needs torch (pip install apsat[gpu])")
    pytest.importorskip("triton", reason="the GPU backend needs triton (pip install apsat[gpu])")
    from apsat.backends.gpu.runner import run_kernels as run
    from apsat.lang.evaluate import evaluate
    from apsat.lang.ops import ELEMENTWISE_OPS
    from apsat.lang.program import Program

    outputs, shapes = {}, {}
    for op in sorted(ELEMENTWISE_OPS):
        p = apsat.parse(*sample(op))
        outputs[op] = p.root
        shapes.update(p.tensor_shapes)
    program = Program(outputs, shapes)
    inputs = _inputs(program)
    got, want = run(program, inputs), evaluate(program, inputs)
    for op in outputs:
        np.testing.assert_allclose(got[op], want[op], rtol=1e-5, atol=1e-6, equal_nan=True,
                                   err_msg=f"{op}: the Triton kernel differs from the reference")


# ---- systolic backend -----------------------------------------------------------------------

def _systolic_run(program):
    """(host steps, simulated outputs, reference outputs) of `program` on systolic:32x32."""
    from apsat.backends import systolic
    from apsat.lang.evaluate import evaluate

    stream = systolic.compile(program, "systolic:32x32")
    inputs = _inputs(program)
    want = evaluate(program, inputs)
    return systolic.cycles(stream)["host_steps"], systolic.simulate(stream, inputs), want


@pytest.mark.parametrize("op", OPERATORS)
def test_systolic_runs_every_operator(op):
    host, got, want = _systolic_run(apsat.parse(*sample(op)))
    assert not host, f"{op}: the systolic backend runs it on the host ({host[0]['reason']})"
    np.testing.assert_allclose(got["out"], want, rtol=1e-6, atol=1e-6, equal_nan=True,
                               err_msg=f"{op}: the systolic simulator differs from the reference")


@pytest.mark.parametrize("op", sorted(set(OPS) - {"opaque"}))
def test_systolic_runs_every_op(op):
    """Views, copies, compute and atoms lower to the stream (a dot-product not over a
    pair is the one HOST step: the extractor maps those to systolic-array)."""
    host, got, want = _systolic_run(apsat.parse(_example(op), SHAPES))
    host = [h for h in host if "dot-product left off the array" not in h["reason"]]
    assert not host, f"{op}: the systolic backend runs it on the host ({host[0]['reason']})"
    np.testing.assert_allclose(got["out"], want, rtol=1e-5, atol=1e-5, err_msg=op)
