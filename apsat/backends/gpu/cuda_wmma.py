"""Element types in the CUDA C kernels, and the tensor-core inner loop of a gemm on half
operands (split out of cuda.py, which writes the kernels).

Buffers are `float`, `__half` or `__nv_bfloat16` arrays (graph.Buffer.dtype). A load of a
half buffer is widened at once (`__half2float`, `__bfloat162float`), so element-wise work,
reductions and epilogues compute in float registers; a store rounds once to the buffer's
type (`__float2half_rn`, `__float2bfloat16_rn`: to nearest even, as the reference rounds).

A gemm whose operands are f16 or bf16 (Kernel.operand) runs its products on tensor cores
through WMMA (<mma.h>): the staged A and B tiles are kept in the operand type in shared
memory (a value computed while staging, a prologue, is rounded to that type there, as the
reference rounds the operand term), each of the block's eight warps owns some of the
tile's 16 x 16 output fragments and accumulates them in float32 (`mma_sync` with 16 x 16 x
16 fragments: the CUDA C tiles, BM and BN of 32 or 64 and BK = 16, always fit them). After
the k loop the fragments go to a float tile in shared memory, from which the epilogue reads
each thread's elements as the scalar kernel reads its registers.
"""
from __future__ import annotations

from apsat.lang import dtypes

C_TYPE = {dtypes.F32: "float", dtypes.F16: "__half", dtypes.BF16: "__nv_bfloat16"}
WIDEN = {dtypes.F16: "__half2float({})", dtypes.BF16: "__bfloat162float({})"}
NARROW = {dtypes.F16: "__float2half_rn({})", dtypes.BF16: "__float2bfloat16_rn({})"}
WARPS = 8        # the gemm's 256 threads


def c_type(types: dict, buf: str) -> str:
    """The C element type of buffer `buf` (types: buffer -> element type; absent: f32)."""
    return C_TYPE[types.get(buf, dtypes.F32)]


def widened(types: dict, buf: str, text: str) -> str:
    """A load `text` of buffer `buf` as a float."""
    dtype = types.get(buf, dtypes.F32)
    return text if dtype == dtypes.F32 else WIDEN[dtype].format(text)


def narrowed(dtype: str, text: str) -> str:
    """The float value `text` rounded once to `dtype` (f32: as it is)."""
    return text if dtype == dtypes.F32 else NARROW[dtype].format(text)


def uses_wmma(k) -> bool:
    """Whether gemm kernel k multiplies on tensor cores (half operands)."""
    return k.kind == "gemm" and k.operand in (dtypes.F16, dtypes.BF16)


def include(k) -> str:
    """The header WMMA needs, for a kernel that uses it."""
    return "#include <mma.h>\n" if uses_wmma(k) else ""


def shared(k) -> list[str]:
    """Shared tiles of a tensor-core gemm: A row-major BM x BK and B row-major BK x BN in
    the operand type (32-byte aligned, as load_matrix_sync requires), the float
    accumulator tile C, and each warp's accumulator fragments (FPW of them)."""
    t = C_TYPE[k.operand]
    return [f"__shared__ __align__(32) {t} As[BM][BK];", f"__shared__ __align__(32) {t} Bs[BK][BN];",
            "__shared__ __align__(32) float Cs[BM][BN];",
            f"constexpr int FN = BN / 16, FPW = (BM / 16 * FN + {WARPS - 1}) / {WARPS};",
            "const int warp = threadIdx.x >> 5;",
            "nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float> cf[FPW];",
            "#pragma unroll", "for (int i = 0; i < FPW; ++i) nvcuda::wmma::fill_fragment(cf[i], 0.0f);"]


def staged(k, array: str, value: str) -> str:
    """The statement storing a staged operand value (a float) into the shared tile."""
    return f"{array} = {narrowed(k.operand, value)};"


def _guard(bm: int, bn: int) -> str:
    """The test that fragment f exists, where the warps do not divide the tile's fragments
    evenly (32 x 32: four fragments, warps 4-7 idle); else none. Why not always: ptxas
    keeps the guarded fragments of a 64 x 64 tile partly on the stack (ResNet-50's f16
    projections: 4 bytes spilled), the unguarded ones in registers."""
    return "" if (bm // 16) * (bn // 16) % WARPS == 0 else "if (f < BM / 16 * FN) "


def inner(k, bm: int, bn: int) -> list[str]:
    """One BK slice: each warp's fragments f = warp, warp + 8, ... multiply-accumulate
    (bm, bn: the tile)."""
    t = C_TYPE[k.operand]
    frag = "nvcuda::wmma::fragment<nvcuda::wmma::matrix_{0}, 16, 16, 16, %s, nvcuda::wmma::row_major> {1};" % t
    return ["#pragma unroll", "for (int i = 0; i < FPW; ++i) {",
            "  const int f = warp + %d * i;" % WARPS,
            "  " + _guard(bm, bn) + "{",
            "    " + frag.format("a", "af"), "    " + frag.format("b", "bf"),
            "    nvcuda::wmma::load_matrix_sync(af, &As[f / FN * 16][0], BK);",
            "    nvcuda::wmma::load_matrix_sync(bf, &Bs[0][f % FN * 16], BN);",
            "    nvcuda::wmma::mma_sync(cf[i], af, bf, cf[i]);", "  }", "}"]


def drain(bm: int, bn: int) -> list[str]:
    """The accumulator fragments into Cs, visible to every thread before the epilogue."""
    return ["#pragma unroll", "for (int i = 0; i < FPW; ++i) {",
            "  const int f = warp + %d * i;" % WARPS,
            "  " + _guard(bm, bn) + "nvcuda::wmma::store_matrix_sync(&Cs[f / FN * 16][f % FN * 16], cf[i], BN,"
            " nvcuda::wmma::mem_row_major);", "}", "__syncthreads();"]
