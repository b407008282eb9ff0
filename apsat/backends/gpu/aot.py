"""Ahead-of-time compilation of the generated Triton kernels, no GPU needed.

    aot_compile(path) / aot_compile_source(text, name) -> {"cubin", "ptx", figures} | {"error"}
    resource_usage(cubin) -> registers, static shared memory, spills (cuobjdump)

The kernel's source is executed from a private temporary folder (files.source_module),
never from a folder someone else could write; its @triton.jit functions are rebound as
compilable JITFunctions where TRITON_INTERPRET=1 in the caller's environment made them
interpreter functions, so nothing in os.environ is changed.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from apsat.backends.gpu.files import source_module


def _compilable(mod):
    """Rebind the module's interpreter functions (made by @triton.jit under
    TRITON_INTERPRET=1) as JITFunctions, which triton.compile needs, helpers included."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    made = {}
    for name, value in list(vars(mod).items()):
        if isinstance(value, InterpretedFunction):
            if id(value) not in made:
                made[id(value)] = JITFunction(value.fn)
            setattr(mod, name, made[id(value)])
    return mod


def _options(mod) -> dict:
    """The compile options the kernel module's launch passes (warps, stages where tuned)."""
    options = {"num_warps": mod.NUM_WARPS, "enable_fp_fusion": False}
    if hasattr(mod, "NUM_STAGES"):
        options["num_stages"] = mod.NUM_STAGES
    return options


def aot_compile(path, capability: int = 90) -> dict:
    """aot_compile_source of the kernel file at `path` (a file you trust: it is run)."""
    path = Path(path)
    return aot_compile_source(path.read_text(), path.stem, capability)


def aot_compile_source(text: str, name: str, capability: int = 90) -> dict:
    """Compile the kernel source `text` (apsat/backends/gpu/triton.py's kernel_source;
    `name` names its module) for GPUTarget("cuda", capability, 32) without a GPU. Returns
    {"cubin": bytes, "ptx": str, "shared_bytes", "registers", "spills", "num_warps"}
    (registers and spills from the cubin's resource usage, via the cuobjdump Triton
    ships; None where it is missing), or {"error": one line} when compilation fails."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    try:
        with source_module(text, name) as mod:
            mod = _compilable(mod)
            src = ASTSource(mod.KERNEL, signature=mod.SIGNATURE,
                            constexprs={k: v for k, v in mod.CONSTEXPRS.items()})
            compiled = triton.compile(src, target=GPUTarget("cuda", capability, 32),
                                      options=_options(mod))
    except Exception as e:  # noqa: BLE001 -- a compiler error is a figure for the report, not a crash
        return {"error": f"{type(e).__name__}: {str(e).strip().splitlines()[-1] if str(e).strip() else ''}"}
    cubin = compiled.asm.get("cubin")
    usage = resource_usage(cubin) if cubin else {}
    return {"cubin": cubin, "ptx": compiled.asm.get("ptx"), "num_warps": mod.NUM_WARPS,
            "shared_bytes": int(compiled.metadata.shared) + int(usage.get("static_shared", 0) or 0),
            "registers": usage.get("registers"), "spills": usage.get("local")}


def resource_usage(cubin: bytes) -> dict:
    """Registers, static shared memory and local memory (spills) of the first function in
    a cubin, from `cuobjdump --dump-resource-usage` (Triton's bundled copy or one on PATH);
    {} when no cuobjdump is available."""
    tool = None
    try:
        import triton

        cand = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        tool = str(cand) if cand.exists() else None
    except ImportError:
        pass
    tool = tool or shutil.which("cuobjdump")
    if tool is None:
        return {}
    # a data file for cuobjdump to read (never imported): NamedTemporaryFile is 0600, O_EXCL
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        res = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True,
                             check=False)
    m = re.search(r"REG:(\d+).*?SHARED:(\d+).*?LOCAL:(\d+)", res.stdout)
    if not m:
        return {}
    return {"registers": int(m.group(1)), "static_shared": int(m.group(2)), "local": int(m.group(3))}
