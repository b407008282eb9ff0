"""A rule matches a constant by its value whatever its source: one-element initializers
become literals at import as Constant nodes do (apsat/frontend/importer.py: Importer.term),
and operand order does not matter (apsat/rules/commute.py). The erf-GELU after a MatMul
fuses into the product's atom with its 1.414 / 1 / 0.5 as Constant nodes or as
initializers, each on either side of its operator; the result equals onnxruntime
(apsat.pipeline.verify's float64 rule)."""
from __future__ import annotations

import numpy as np
import pytest
from models import make_model
from onnx import helper, numpy_helper

import apsat


def _gelu_after_matmul(source: str, constants_first: bool):
    """y = gelu_erf(x @ w): x * 0.5 * (1 + erf(x / 1.4142135)), its three constants given
    as `source` ("constant" nodes or "initializer"s), written left of each operator
    when `constants_first`."""
    rng = np.random.default_rng(0)
    weights = {"w": (rng.standard_normal((16, 24)) * 0.3).astype(np.float32)}
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"])]
    values = {"c_sqrt2": 1.4142135, "c_one": 1.0, "c_half": 0.5}
    for name, v in values.items():
        if source == "initializer":
            weights[name] = np.array(v, np.float32)
        else:
            nodes.append(helper.make_node("Constant", [], [name],
                                          value=numpy_helper.from_array(np.array(v, np.float32))))

    def op(kind, a, b, out):
        nodes.append(helper.make_node(kind, [b, a] if constants_first and kind != "Div" else [a, b], [out]))

    op("Div", "h", "c_sqrt2", "s")
    nodes.append(helper.make_node("Erf", ["s"], ["e"]))
    op("Add", "e", "c_one", "e1")
    op("Mul", "h", "e1", "m")
    op("Mul", "m", "c_half", "y")
    return make_model(nodes, {"x": (3, 16)}, ["y"], weights)


@pytest.mark.parametrize("source", ["constant", "initializer"])
@pytest.mark.parametrize("constants_first", [False, True])
def test_erf_gelu_fuses_whatever_the_constants_source_and_order(source, constants_first):
    model = _gelu_after_matmul(source, constants_first)
    res = apsat.optimize(apsat.load_onnx(model), target="gpu", verify=True)
    acts = [t.args[0].op for t in res.program.terms() if t.op == "fused-dot-bias-act"]
    assert acts == ["gelu"], res.program.to_text()[:400]
    assert res.report["verification"]["ok"]


def test_a_one_element_initializer_is_a_literal():
    model = _gelu_after_matmul("initializer", False)
    m = apsat.load_onnx(model)
    assert {"c_sqrt2", "c_one", "c_half"}.isdisjoint(m.weights)
    literals = {t.args[0] for t in m.program.terms() if t.op == "access-literal"}
    assert {1.0, 0.5} <= literals and any(abs(v - 1.4142135) < 1e-6 for v in literals)
