"""Dot-products over access-pairs of broadcasts read as independent matrix products
(apsat/targets/pair_product.py), and how the systolic cost model prices them."""
import pytest
from models import grouped_convnet

from apsat.explore.egraph import EGraph
from apsat.frontend.importer import load_onnx
from apsat.extract import extract
from apsat.targets.systolic import HOST_HANDOFF_CYCLES
from apsat.targets.pair_product import PairProduct, pair_product
from apsat.targets.pair_dot import pair_dot_cost
from apsat.targets.accelerator import PRESETS, Accelerator
from apsat.targets.systolic import gemm_cost, vector_cycles


def test_grouped_convolution_is_one_product_per_group():
    # (N, G, M/G, OH, OW): windows vary over G, OH, OW; weights over G, M/G; item C/G x 5 x 5
    pp = pair_product((1, 2, 128, 27, 27), (48, 5, 5), (1, 2, 1, 27, 27), (1, 2, 128, 1, 1))
    # the filters come first in the result, so the weights are the left operand
    assert pp == PairProduct(groups=2, m=128, k=1200, n=729, left=1)
    assert pp.macs == 2 * 128 * 1200 * 729


def test_depthwise_convolution_has_one_column():
    pp = pair_product((1, 112, 1, 28, 28), (1, 3, 3), (1, 112, 1, 28, 28), (1, 112, 1, 1, 1))
    assert pp == PairProduct(groups=112, m=784, k=9, n=1, left=0)


def test_plain_matrix_product_and_pure_elementwise_pairs():
    assert pair_product((4, 5), (3,), (4, 1), (1, 5)) == PairProduct(1, 4, 3, 5, 0)
    assert pair_product((4, 5), (3,), (1, 5), (4, 1)) == PairProduct(1, 4, 3, 5, 1)
    # both operands vary everywhere: 20 groups of 1 x 3 . 3 x 1
    assert pair_product((4, 5), (3,), (4, 5), (4, 5)) == PairProduct(20, 1, 3, 1, 0)


@pytest.mark.parametrize("it,pre0,pre1,why", [
    ((4, 5, 6), (4, 1, 6), (1, 5, 1), "rows, columns, rows: no contiguous block per group"),
    ((4, 5), (4, 5), (1, 5), "a group axis after a row axis"),
    ((4, 5), (1, 5), (1, 5), "an axis of size 4 broadcast in both operands"),
    ((4, 5), (4,), (1, 5), "an operand of another rank"),
])
def test_refused_layouts(it, pre0, pre1, why):
    assert pair_product(it, (3,), pre0, pre1) is None, why


def test_pair_dot_cost_puts_wide_groups_on_the_array_and_batches_depthwise_filters():
    acc = PRESETS["32x32"]
    wide = pair_dot_cost(acc, 2, 128, 1200, 729)
    assert wide.unit == "array" and wide.batched_cycles == 0      # n > 1: no batching
    assert wide.array_cycles == 2 * gemm_cost(acc, 128, 1200, 729).total_cycles
    # ShuffleNet's first depthwise conv: 112 filters, 32 a pass as a block-diagonal
    # (32 x 288) . (288 x 784) product (the last pass 16 filters): 2.3x fewer cycles
    # than the vector unit, 9x fewer than one filter a pass
    depthwise = pair_dot_cost(acc, 112, 784, 9, 1)
    assert depthwise.unit == "batched" and depthwise.batch == 32
    assert depthwise.batched_cycles == (3 * gemm_cost(acc, 32, 288, 784).total_cycles
                                        + gemm_cost(acc, 16, 144, 784).total_cycles)
    assert depthwise.vector_cycles == vector_cycles(acc, 112 * 784 * 9, 3)
    assert depthwise.cycles == depthwise.batched_cycles < depthwise.vector_cycles / 2
    assert depthwise.vector_cycles < depthwise.array_cycles
    # on an array of one row there is nothing to batch: the vector unit wins
    assert pair_dot_cost(Accelerator(1, 32, "os", 64, 64, 64, 64.0), 112, 784, 9, 1).unit == "vector"


def test_systolic_cost_model_prices_grouped_convolutions_off_the_host():
    model = load_onnx(grouped_convnet())
    eg = EGraph("systolic")
    handles = eg.add_outputs(model.program)
    prog = extract(eg, handles, cost="systolic")
    # a grouped and a depthwise conv: neither pays the host hand-off any more
    assert prog.op_counts().get("compute dot-product", 0) == 2
    assert prog.cost < HOST_HANDOFF_CYCLES
