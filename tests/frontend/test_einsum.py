"""ONNX Einsum imports as the language's products and reductions (lowering_einsum.py): no
opaque call, and every backend equals onnxruntime on seeded inputs (rtol 1e-5, atol 1e-6:
products sum in another order). The equations are those exporters write (LongT5's and
T5's relative attention, bilinear layers, batched products with an ellipsis, outer
products, a transpose, a reduction)."""
from __future__ import annotations

import numpy as np
import pytest
from backend_cases import BACKENDS, assert_backend_equals, checked_model, prepare
from onnx import TensorProto, helper

RNG = np.random.default_rng(11)
F = TensorProto.FLOAT
EQUATIONS = {                     # equation -> operand dims, output dims
    "bhqd,bhkd->bhqk": ([(1, 2, 5, 4), (1, 2, 6, 4)], (1, 2, 5, 6)),
    "bhqk,bhkd->bhqd": ([(1, 2, 5, 6), (1, 2, 6, 4)], (1, 2, 5, 4)),
    "...ij,...jk->...ik": ([(2, 3, 4, 5), (1, 3, 5, 2)], (2, 3, 4, 2)),
    "i,j->ij": ([(4,), (3,)], (4, 3)),
    "bi,bj->b": ([(3, 4), (3, 5)], (3,)),
    "ij->ji": ([(3, 5)], (5, 3)),
    "bij->bj": ([(2, 3, 4)], (2, 4)),
    "ij,jk": ([(3, 4), (4, 2)], (3, 2)),
    "bnd,dh->bnh": ([(2, 5, 6), (6, 3)], (2, 5, 3)),
}


@pytest.fixture(scope="module")
def results():
    out = {}
    for eq, (shapes, out_dims) in EQUATIONS.items():
        names = [f"x{i}" for i in range(len(shapes))]
        proto = checked_model([helper.make_node("Einsum", names, ["y"], equation=eq)],
                              {n: (F, list(s)) for n, s in zip(names, shapes)}, {"y": (F, list(out_dims))}, {},
                              opset=12)
        out[eq] = prepare(proto, {n: RNG.standard_normal(s).astype(np.float32) for n, s in zip(names, shapes)})
    return out


@pytest.mark.parametrize("eq", sorted(EQUATIONS))
def test_imports_without_an_opaque_call(results, eq):
    assert not results[eq]["model"].program.opaque_nodes


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("eq", sorted(EQUATIONS))
def test_equals_onnxruntime(results, eq, backend):
    assert_backend_equals(results[eq], backend, 1e-5, 1e-6, eq)