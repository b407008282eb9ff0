"""Tile sizes for the generated kernels: a small search over an H100 roofline.

apsat/extract/cost_gpu.py prices a kernel as launch + max(compute, memory) with ideal data
movement. A tile size changes what the ideal hides: a matmul tile pads M, N and K up to
multiples of the tile (masked lanes still occupy the machine), the number of tiles against
the 132 SMs decides how much of the chip works (wave quantisation), and each operand is
re-read from L2 once per tile of the other dimension. `gemm_tiles` prices every candidate
that fits the shared-memory and register budget with those three effects and keeps the
cheapest, preferring larger tiles on ties (fewer programs: cheaper to launch, and much
faster under the Triton interpreter). Element-wise and reduction kernels are memory-bound:
their search only balances padding against parallelism. The attention kernel's search
(`attention_tiles`) weighs the padding of its score tiles, wave quantisation and the
re-reads of K and V per query tile, like gemm_tiles.

Every function returns a plain dict (the tile parameters plus `modelled_us`), which the
kernel keeps and the report shows; callers may pass their own dict instead.
"""
from __future__ import annotations

from apsat.targets.gpu import HBM_BYTES_PER_US, LAUNCH_US, TFLOPS

SMS = 132                       # H100 SXM streaming multiprocessors
SMEM_PER_SM = 228 * 1024        # bytes of shared memory per SM
L2_BYTES_PER_US = 3 * HBM_BYTES_PER_US   # L2 re-reads: roughly three times HBM bandwidth
THREADS_PER_SM = 2048
PEAK_PER_US = TFLOPS["fp32"] * 1e6   # kernels compute in fp32 (no tensor-core formats)


def next_pow2(n: int) -> int:
    """The least power of two >= n (1 for n <= 1)."""
    return 1 << max(0, (int(n) - 1).bit_length())


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def gemm_time(batch: int, m: int, n: int, k: int, bm: int, bn: int, bk: int, stages: int = 2):
    """Modelled microseconds of a batched (batch x m x n x k) fp32 matmul with (bm, bn, bk)
    tiles, or None when the tile does not fit an SM (shared memory, accumulator registers)."""
    warps = 8 if bm * bn >= 128 * 128 else 4
    threads = 32 * warps
    smem = (bm * bk + bk * bn) * 4 * stages
    if smem > SMEM_PER_SM or bm * bn // threads > 128:
        return None
    tiles = batch * _ceil(m, bm) * _ceil(n, bn)
    util = tiles / (_ceil(tiles, SMS) * SMS)     # SMs busy: few tiles, or a ragged last wave
    padded = 2.0 * batch * _ceil(m, bm) * bm * _ceil(n, bn) * bn * _ceil(k, bk) * bk
    compute = padded / (PEAK_PER_US * max(util, 1e-9))
    a, b, c = batch * m * k, batch * k * n, batch * m * n
    dram = (a + b + c) * 4 / HBM_BYTES_PER_US
    l2 = (a * _ceil(n, bn) + b * _ceil(m, bm) + c) * 4 / L2_BYTES_PER_US
    return LAUNCH_US + max(compute, dram, l2)


def gemm_tiles(batch: int, m: int, n: int, k: int) -> dict:
    """The cheapest (BM, BN, BK) for the matmul under gemm_time; tl.dot needs every tile
    side >= 16, and no side is larger than the problem's side rounded up to a power of 2."""
    best = None
    for bm in (16, 32, 64, 128):
        for bn in (16, 32, 64, 128):
            for bk in (16, 32, 64):
                if (bm > max(16, next_pow2(m)) or bn > max(16, next_pow2(n))
                        or bk > max(16, next_pow2(k))):
                    continue
                t = gemm_time(batch, m, n, k, bm, bn, bk)
                if t is None:
                    continue
                key = (round(t, 6), -(bm * bn * bk))
                if best is None or key < best[0]:
                    best = (key, {"BM": bm, "BN": bn, "BK": bk,
                                  "num_warps": 8 if bm * bn >= 128 * 128 else 4,
                                  "modelled_us": t})
    return best[1]


def _streaming_time(elements: int, moved_bytes: float) -> float:
    """A memory-bound kernel: bandwidth scaled by how much of the chip `elements` lanes fill."""
    fill = min(1.0, elements / (SMS * THREADS_PER_SM))
    return LAUNCH_US + moved_bytes / HBM_BYTES_PER_US / max(fill, 1e-9)


def elementwise_tiles(n: int, moved_bytes: float) -> dict:
    """BLOCK elements per program: the power of two in 128..1024 that pads least, larger on
    ties (a memory-bound kernel's time barely depends on it beyond padding)."""
    best = None
    for block in (128, 256, 512, 1024):
        padded = _ceil(n, block) * block
        t = _streaming_time(n, moved_bytes) * padded / n
        key = (round(t, 6), -block)
        if best is None or key < best[0]:
            best = (key, {"BLOCK": block, "num_warps": 4, "modelled_us": t})
    return best[1]


def reduce_tiles(rows: int, cols: int, moved_bytes: float) -> dict:
    """BC columns per chunk (the row, up to 1024) and BR rows per program (BR x BC <= 4096
    elements in registers); more rows per program on ties."""
    bc = min(1024, max(16, next_pow2(cols)))
    best = None
    br = 1
    while br * bc <= 4096 and br <= max(1, next_pow2(rows)):
        programs = _ceil(rows, br)
        t = _streaming_time(min(rows * cols, programs * 128), moved_bytes)
        key = (round(t, 6), -br)
        if best is None or key < best[0]:
            best = (key, {"BR": br, "BC": bc, "num_warps": 4, "modelled_us": t})
        br *= 2
    return best[1]


def cuda_gemm_tiles(tiles: dict) -> dict:
    """The CUDA C matmul's tile: 16 x 16 threads each computing a (BM/16) x (BN/16) block,
    BM and BN of 32 or 64 (the Triton choice rounded into that range), BK = 16."""
    bm = 64 if tiles.get("BM", 64) >= 64 else 32
    bn = 64 if tiles.get("BN", 64) >= 64 else 32
    return {"BM": bm, "BN": bn, "BK": 16, "threads": 256}


def attention_pad(size: int) -> int:
    """The attention kernel's tile of a head dimension (d or e): the whole dimension
    rounded up to a power of two, at least 16 (tl.dot's smallest side)."""
    return max(16, next_pow2(size))


def attention_time(batch: int, m: int, n: int, d: int, e: int, bm: int, bn: int,
                   other_elements: float = 0.0, must_fit: bool = True):
    """Modelled microseconds of the FlashAttention kernel (batch x m queries against n keys,
    head widths d and e) with BM x BN score tiles, or None when the tile does not fit an SM
    (its K and V tiles in shared memory, q, the scores and the accumulator in registers).
    Each query tile re-reads K and V (from L2); padding of m, n, d and e costs compute;
    other_elements: what else it reads and writes once (the bias, the output); must_fit
    False: the time even when the tile does not fit."""
    bd, be = attention_pad(d), attention_pad(e)
    warps = 8 if bm >= 128 else 4
    smem = (bd * bn + bn * be) * 4 * 2            # K and V tiles, double-buffered
    regs = (bm * bd + bm * be + 2 * bm * bn) // (32 * warps)
    if must_fit and (smem > SMEM_PER_SM or regs > 160):
        return None
    tiles = batch * _ceil(m, bm)
    util = tiles / (_ceil(tiles, SMS) * SMS)
    padded = 2.0 * batch * _ceil(m, bm) * bm * _ceil(n, bn) * bn * (bd + be)
    compute = padded / (PEAK_PER_US * max(util, 1e-9))
    kv = batch * n * (d + e)
    dram = (batch * m * d + kv + other_elements) * 4 / HBM_BYTES_PER_US
    l2 = kv * _ceil(m, bm) * 4 / L2_BYTES_PER_US
    return LAUNCH_US + max(compute, dram, l2)


def attention_tiles(batch: int, m: int, n: int, d: int, e: int, moved_elements: float = 0.0) -> dict:
    """The cheapest (BM, BN) under attention_time (powers of two, 16..128, no larger than
    m or n rounded up to a power of two; larger tiles on ties), with BD and BE from
    attention_pad. moved_elements: the kernel's elements read, for the memory term."""
    best = None
    for bm in (16, 32, 64, 128):
        for bn in (16, 32, 64, 128):
            if bm > max(16, next_pow2(m)) or bn > max(16, next_pow2(n)):
                continue
            t = attention_time(batch, m, n, d, e, bm, bn, moved_elements)
            if t is None:
                continue
            key = (round(t, 6), -(bm * bn))
            if best is None or key < best[0]:
                best = (key, {"BM": bm, "BN": bn, "BD": attention_pad(d), "BE": attention_pad(e),
                              "num_warps": 8 if bm >= 128 else 4, "modelled_us": t})
    if best is None:     # a head too wide for any tile: the smallest, let the compiler say
        return {"BM": 16, "BN": 16, "BD": attention_pad(d), "BE": attention_pad(e), "num_warps": 4,
                "modelled_us": attention_time(batch, m, n, d, e, 16, 16, moved_elements, False)}
    return best[1]


def cuda_attention_tiles(n: int, d: int, e: int) -> dict:
    """The CUDA C attention kernel's tile: ROWS query rows a block (one warp each) and BN
    keys a shared-memory tile (one lane each), the largest (ROWS <= 8, BN <= 32 and no
    more than n rounded up to a power of two) whose static shared memory (Q rows, the K
    tile padded against bank conflicts, the V tile, the probabilities) fits 48 KiB; heads
    too wide for any get the smallest, and nvcc's error."""
    top = min(32, next_pow2(n))
    for rows in (8, 4, 2, 1):
        for bn in (32, 16, 8, 4, 2, 1):
            smem = 4 * (rows * d + bn * (d + 1) + bn * e + rows * bn)
            if bn <= top and smem <= 48 * 1024:
                return {"ROWS": rows, "BN": bn, "threads": 32 * rows, "shared_bytes": smem}
    return {"ROWS": 1, "BN": 1, "threads": 32, "shared_bytes": 4 * (2 * d + 1 + e + 1)}
