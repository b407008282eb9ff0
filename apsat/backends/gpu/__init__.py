"""GPU kernel generation for the `gpu` target (the optional extra `apsat[gpu]`).

    lower(program, tiles=None) -> KernelGraph      apsat.backends.gpu.lower
    run(program, inputs, ...)  -> like evaluate    apsat.backends.gpu.runner.run_kernels (Triton)
    write_kernels(program, directory) -> dict      apsat.backends.gpu.write

Modules: expr (index/value expressions), views (access patterns as indexing), graph (the
kernel graph's data), regions (matmul and reduction kernels), attention (the attention
atom's kernel), inline (what runs inside other kernels: epilogues, prologues, unrolled
small reductions, norms read through their row statistics), folds (those reductions as
values), merge (sibling products as one gemm), lower (program -> kernel graph), tiling
(tile search on the roofline), emit (shared statement emission), triton (Triton
sources), cuda (CUDA C sources, nvcc), triton_norms and cuda_norms (a norm's row passes
in each dialect), aot (Triton's ahead-of-time compile, from a private directory), runner
(the generated runner module, and run_kernels, which writes it into the per-user cache
and runs it), files (that cache: per-user, 0700, bounded), host (host steps, stored as
program text, never pickled), write (write_kernels and its figures), backend (the gpu
target's Backend), tuning (each kernel shape's tile space, and the per-GPU cache of tuned
tiles), profile (every kernel timed on the model's own buffers; the tile search),
cuda_launch (the CUDA C cubins launched through the CUDA driver API).

Nothing here imports torch or triton at module level: the core installs and runs without
them, and only running or compiling kernels needs them.
"""

__all__ = ["lower", "run", "write_kernels"]


def __getattr__(name):
    if name == "lower":
        from apsat.backends.gpu.lower import lower
        return lower
    if name == "run":
        from apsat.backends.gpu.runner import run_kernels
        return run_kernels
    if name == "write_kernels":
        from apsat.backends.gpu.write import write_kernels
        return write_kernels
    raise AttributeError(f"module 'apsat.backends.gpu' has no attribute {name!r}")
