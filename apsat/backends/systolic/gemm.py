"""GEMMs on the array: an (m x k) . (k x n) product tiled for its dataflow (the
accelerator's, or on a flexible array the one gemm_cost finds fastest for the product).

The tiling follows the analytical model in apsat/targets/systolic.py (gemm_cost), so the
stream moves the words that model counts and runs the folds it counts:

  os  (Sr, Sc, T) = (m, n, k): outputs stationary. Column folds outer, row folds inner;
      B's column block is loaded once per column fold when it fits a filter half (else
      B streams in k-chunks per fold); A's row blocks are re-read per column fold unless
      all of A fits an ifmap half. A fold whose operands exceed a half is streamed in
      k-chunks that accumulate in the PEs (one fill per fold).
  ws  (k, n, m): weight tiles stationary (PRELOAD), A streams through, each row fold's
      partial sums drain to DRAM (STORE accumulate, as SCALE-Sim counts them).
  is  (k, m, n): input tiles stationary, B streams, partial sums as ws.
  osk (a flexible array only, where os would re-read B per row fold): os passes with
      B's column block in the whole filter scratchpad, or per output block each k-chunk
      of B loaded once and passed through the block's row folds, which accumulate in
      the ofmap (targets.systolic.os_blocking).

Outputs collect in an ofmap half: consecutive folds fill one block, which is stored when
full, so DRAM writes start once a half is full and the array fills the other half
meanwhile (the double buffering SCALE-Sim assumes). A fused bias is where the
accumulators start: its row is loaded beside the block and the block's first passes
start from it (MATMUL init; in the first row fold under ws/is). A fused activation runs on
the vector unit over the block before its store; under ws/is with several row folds the
last fold first loads the partial sums back and accumulates onto them, so the epilogue
sees final values. Where ws/is stream long folds whose blocks also need the ofmap DMA or
the vector unit (a bias row, a partial-sum reload, an epilogue), the blocks rotate through
quarters of the ofmap and their stores are issued two blocks late, so the reloads and
bias rows queue ahead of them and the epilogue overlaps the next passes.

im2col: a left operand that reads its base buffer's words more than once (windows) is
formed on chip from the whole input held in the ifmap scratchpad when that input fits
it (cost_systolic._im2col's condition, a_mode "resident"), else materialised in DRAM by
a COPY first ("im2col"), or with the lowering option im2col="gather" loaded tile by tile
through the windows' address pattern, each tile reading its share of the input
("gather").

Modules: this one lowers the GEMM terms and picks each product's dataflow; tiles holds
the pieces every tiling uses (the Gemm record, folds, passes, output blocks, epilogue);
dataflows holds the os, ws and is tilings.
"""
from __future__ import annotations

import math

from apsat.backends.systolic.dataflows import TILINGS
from apsat.backends.systolic.isa import Copy
from apsat.backends.systolic.shared import lower_shared, shareable
from apsat.backends.systolic.tiles import Gemm
from apsat.backends.systolic.views import footprint
from apsat.targets.systolic import fused_gemm_cost
from apsat.targets.vector_share import vector_share

__all__ = ["Gemm", "a_mode", "lower_fused", "lower_systolic", "product", "residual_fusions"]


# ---- entry points ---------------------------------------------------------------------------

def lower_systolic(L, t) -> None:
    """`systolic-array rows cols a b`: a ((batch),(rows)) times b ((),(rows, cols))."""
    rows, cols, a, b = t.args
    m = math.prod(L.program.shape_of(a)[0])
    ba, sa = L.need_chain(a, "the array's left operand")
    bb, sb = L.need_chain(b, "the array's right operand")
    _lower(L, t, "systolic-array", m, rows, cols, ba, sa, L.matrix(bb, sb, rows, cols), None, None)


def lower_fused(L, t, zip_with=None) -> None:
    """`fused-dot-bias(-act) [OP] a b bias`: a ((ia),(item)) . b ((ib),(item)) + bias.
    zip_with: (consumer term, other operand term, operator text, whether the other
    operand comes first) for an element-wise consumer fused into the epilogue (see
    residual_fusions); the result then goes to the consumer's buffer under its tag. A
    consumer that adds the other operand first, to a product without activation (a
    residual add), does not zip: the product's accumulators start from that operand's
    block (Gemm.start), and only the unary maps after the add run as the epilogue."""
    from apsat.backends.systolic.vector import op_text

    act = op_text(t.args[0]) if t.op == "fused-dot-bias-act" else None
    a, b, bias = t.args[-3:]
    (ia, item), (ib, _) = L.program.shape_of(a), L.program.shape_of(b)
    m, k, n = math.prod(ia), math.prod(item), math.prod(ib)
    ba, sa = L.need_chain(a, "the fused kernel's left operand")
    bb, sb = L.need_chain(b, "the fused kernel's right operand")
    bc, sc = L.need_chain(bias, "the fused kernel's bias")
    # B is read transposed ((n x k) -> (k x n)): a strided DMA pattern, not a copy.
    bview = L.view(bb, sb + (("reshape", (n, k)), ("transpose", (1, 0))))
    label = t.op + (f" {act}" if act else "")
    extra = {}
    if zip_with is not None:
        consumer, other, text, first = zip_with
        bo, so = L.need_chain(other, "the fused element-wise operand")
        view = L.matrix(bo, so, m, n)
        rest = _after_add(text) if act is None else None
        if rest is None:
            extra = {"res": view, "res_op": text, "res_first": first}
        else:
            # (a . b + bias) + other, then unary maps: the accumulators start from the
            # other operand's block (as from partial sums), the maps are the epilogue.
            extra, act = {"start": view}, rest or None
        label += f" + {text}"
        t = consumer
    _lower(L, t, label, m, k, n, ba, sa, bview, L.matrix(bc, sc, 1, n), act, extra)


def _after_add(text: str) -> str | None:
    """For an element-wise operator that adds first (`elementwise-add`, or a chain of it
    and unary maps): the text of what follows the add ("" for nothing); else None."""
    from apsat.backends.systolic.vector import op_text, operator_term
    from apsat.lang.ops import chain_parts

    first, *rest = (op_text(p) for p in chain_parts(operator_term(text)))
    if first != "elementwise-add":
        return None
    chain = rest[0] if rest else ""
    for part in rest[1:]:
        chain = f"(chain {chain} {part})"
    return chain


def _lower(L, t, label, m, k, n, base_a, steps_a, bview, bias, act, extra=None) -> None:
    aview = L.matrix(base_a, steps_a, m, k)
    mode = a_mode(L, base_a, aview, m * k, L.im2col == "model")
    L.begin(t, "gemm", label, m=m, k=k, n=n, a_mode=mode)
    place = L.placed.get(t)         # stored into its columns of a concatenation (inplace.py)
    where = {"c_cols": place.cols, "c_col0": place.offset} if place else {}
    product(L, Gemm(m, k, n, aview, bview, L.buf_of[t], mode, None, bias, act, **(extra or {}), **where))


def residual_fusions(L, order) -> dict:
    """{consumer: (gemm term, other operand, operator text, other first)} for each
    `compute OP (access-pair X Y)` whose OP is one binary element-wise operator (then
    unary ones: a chain such as add-then-relu) and one of whose operands is a
    fused-dot-bias(-act) that nothing else reads, outside the init section, with the
    same dims as the other operand: the GEMM's epilogue applies OP as its output
    blocks drain, so the product's result never goes to DRAM. (The cost model prices
    the two apart; the stream is the cheaper for it.)"""
    from apsat.backends.systolic.vector import PAIRWISE, op_parts, op_text
    from apsat.lang.ops import UNARY_MAPS

    users: dict = {}
    for t in order:
        for c in t.children():
            users[c] = users.get(c, 0) + 1
    outputs = set(L.program.outputs.values())
    found, taken = {}, set()
    for t in order:
        if t.op != "compute" or t.args[1].op != "access-pair" or L.const.get(t, False):
            continue
        parts = op_parts(t.args[0])
        if parts[0] not in PAIRWISE or not all(p in UNARY_MAPS for p in parts[1:]):
            continue
        pair = t.args[1].args
        for i in (0, 1):
            g = pair[i]
            while g.op == "access" and users.get(g, 0) == 1 and g not in outputs:
                g = g.args[0]
            if (g.op in ("fused-dot-bias", "fused-dot-bias-act") and users.get(g, 0) == 1
                    and g not in outputs and g not in taken and L.dims(pair[0]) == L.dims(pair[1])):
                found[t] = (g, pair[1 - i], op_text(t.args[0]), i == 1)
                taken.add(g)
                break
    return found


def a_mode(L, base_a: str, aview: str, words: int, materialise: bool) -> str:
    """dense, or for a window view (it reads its base's words more than once): resident
    when the base fits the ifmap scratchpad, else im2col (materialise) or gather."""
    if footprint(L.stream.buffers[base_a].dims, L.stream.views[aview].steps) >= words:
        return "dense"
    if L.stream.buffers[base_a].size <= L.acc.ifmap_words:
        return "resident"
    return "im2col" if materialise else "gather"


def product(L, g: Gemm) -> None:
    """Emit the instructions of product `g` (its a_mode set) in the dataflow
    fused_gemm_cost gives it with its epilogue: the accelerator's, or a flexible array's
    best for this product; or, where targets.vector_share finds it faster on a flexible
    array, split between the array and the vector unit (shared.py). The group records
    the dataflow (the last product of a grouped convolution's groups)."""
    acc = L.acc
    m, k, base_a = g.m, g.k, L.stream.views[g.a].base
    base_size = L.stream.buffers[base_a].size
    mode, aview = g.a_mode, g.a
    if mode == "resident":
        g.a_full = L.view(base_a, (("reshape", (1, base_size)),))
    elif mode == "im2col":
        # The windows do not fit on chip: write the im2col matrix to DRAM, then read it densely.
        mat = L.new_buffer((m, k))
        L.emit(Copy(mat, aview, L.dram_words(aview, m * k), tag=L.tag))
        g.a = L.buffer_matrix(mat, m, k)
    share = vector_share(acc, g.m, g.k, g.n, g.epilogue_ops) if shareable(g) else None
    if share is not None:
        lower_shared(L, g, share)
        return
    L.dataflow = fused_gemm_cost(acc, g.m, g.k, g.n, g.epilogue_ops)[0].dataflow
    L.stream.groups[L.tag].dataflow = L.dataflow
    L.blocks = g.blocks
    TILINGS[L.dataflow](L, g)
    L.blocks = 1


