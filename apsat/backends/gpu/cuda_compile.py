"""Compiling the generated CUDA C with nvcc (split out of cuda.py, which writes it):
`compile_cuda(source, path)` runs `nvcc -arch=sm_90 -cubin -Xptxas -v` and parses ptxas's
register, shared-memory and spill figures; `nvcc_path()` says whether nvcc is here."""
from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

def nvcc_path() -> str | None:
    """Path of nvcc, or None when the CUDA toolkit is not on this machine."""
    return shutil.which("nvcc")


_PTXAS = re.compile(r"Used (\d+) registers(?:, used (\d+) barriers)?(?:, (\d+) bytes smem)?")
_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def compile_cuda(source: str, path, arch: str = "sm_90", timeout: float = 120.0) -> dict:
    """Write `source` to `path` (a .cu file) and compile it with
    `nvcc -arch=ARCH -cubin -Xptxas -v` next to it (path with .cubin).

    Returns {"ok", "returncode", "log" (nvcc's whole output), "cubin" (path or None),
    "registers", "shared_bytes", "spill_stores", "spill_loads", "seconds"}; ok is False
    when nvcc fails or prints a warning (generated code must compile cleanly). Raises
    FileNotFoundError when nvcc is missing (callers check nvcc_path() first)."""
    nvcc = nvcc_path()
    if nvcc is None:
        raise FileNotFoundError("nvcc is not on PATH")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    cubin = path.with_suffix(".cubin")
    t = time.perf_counter()
    res = subprocess.run([nvcc, f"-arch={arch}", "-cubin", "-Xptxas", "-v", "-o", str(cubin), str(path)],
                         capture_output=True, text=True, timeout=timeout, check=False)
    log = (res.stdout + res.stderr).strip()
    out = {"ok": res.returncode == 0 and "warning" not in log.lower(), "returncode": res.returncode,
           "log": log, "cubin": str(cubin) if res.returncode == 0 and cubin.exists() else None,
           "registers": None, "shared_bytes": None, "spill_stores": None, "spill_loads": None,
           "seconds": round(time.perf_counter() - t, 3)}
    m = _PTXAS.search(log)
    if m:
        out["registers"] = int(m.group(1))
        out["shared_bytes"] = int(m.group(3) or 0)
    s = _SPILL.search(log)
    if s:
        out["spill_stores"], out["spill_loads"] = int(s.group(2)), int(s.group(3))
    return out
