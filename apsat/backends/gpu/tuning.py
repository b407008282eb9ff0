"""Tile tuning: each kernel shape's tile space, and an on-disk record of what timing chose.

tiling.py picks tiles on a roofline; a GPU decides by timing. This module says what to time
and remembers the outcome; profile.py does the timing on a GPU.

    candidates(kernel, limit) -> [tiles]  the roofline's choice first, then the settings worth
                                          timing (tile shapes ranked by the roofline, crossed
                                          with warps and pipeline stages)
    kernel_key(kernel) -> str             a hash of the kernel's Triton source with its name,
                                          its buffer names and its tiles left out
    TuningCache(gpu)                      tuned tiles by kernel key, one JSON file per GPU name
    tuned_cache(gpu=None)                 that cache for `gpu` or the GPU torch sees; None without

The key is the source, not the model or layer the kernel came from: BERT's twelve layers
share one search, and a kernel whose generated code changes (a new apsat, another fusion)
is searched again. The cache is a JSON file in the per-user cache
(`<user cache>/apsat/tuning/<gpu>.json`, folders 0700, files.cache_dir); it holds tile
numbers only, never code, and an entry that does not parse as tiles is ignored with a
warning. `lower(program, tuned=cache)` takes a cached kernel's tiles instead of the
roofline's; write_kernels and run_kernels pass the cache of the GPU they target.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import time
import warnings
from pathlib import Path

from apsat.backends.gpu import tiling
from apsat.backends.gpu.graph import Kernel

FORMAT = 1
# the tile settings a kernel of each kind reads (triton.py), with the launch options
TILE_KEYS = {"gemm": {"BM", "BN", "BK"}, "reduce": {"BR", "BC"}, "attention": {"BM", "BN", "BD", "BE"},
             "elementwise": {"BLOCK"}}
LAUNCH_KEYS = {"num_warps", "num_stages"}
# tiles that every kernel of a kind can be rendered with: the key's source uses them, so
# the key does not depend on what the roofline or a tuning chose
_CANONICAL = {"gemm": {"BM": 16, "BN": 16, "BK": 16}, "reduce": {"BR": 1, "BC": 16},
              "attention": {"BM": 16, "BN": 16}, "elementwise": {"BLOCK": 128}}


def kernel_key(k: Kernel) -> str:
    """A hex digest naming the computation of kernel `k`: its Triton source rendered under
    a fixed name and fixed tiles, with its buffers renamed by position (the first input is
    the same parameter whatever buffer feeds it)."""
    from apsat.backends.gpu.triton import kernel_source

    text = kernel_source(dataclasses.replace(k, name="kernel", tiles=dict(_CANONICAL[k.kind])))
    text = text.split("\ndef launch(")[0]      # the launcher repeats the buffers' names
    for i, buf in enumerate(k.reads):       # in the kernel, a buffer is its <name>_ptr
        text = re.sub(rf"\b{re.escape(buf)}_ptr\b", f"in{i}__ptr", text)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def plain_tiles(tiles: dict) -> dict:
    """The tile settings and launch options of `tiles`, without figures (modelled_us ...)."""
    return {a: int(v) for a, v in tiles.items() if a.isupper() or a in LAUNCH_KEYS}


# ---- the search space ------------------------------------------------------------------------

def candidates(k: Kernel, limit: int = 16) -> list[dict]:
    """Tile settings to time for kernel `k`, at most `limit`: k's own (the roofline's
    choice) first, then the kind's space in the roofline's order of preference."""
    own = plain_tiles(k.tiles)
    out = [own]
    sizes = {g: math.prod(d) for g, d in k.axes.items()}
    for c in _SPACES[k.kind](k, sizes):
        c = {**own, **c}
        if c not in out:
            out.append(c)
    return out[:max(1, limit)]


# (pipeline stages, warps) in the order tried: Triton's default depth first
_STAGES_WARPS = ((3, 4), (3, 8), (2, 4), (4, 4), (2, 8), (4, 8))


def _gemm_space(k: Kernel, a: dict):
    """The four cheapest tile shapes under tiling.gemm_time, each with 4 or 8 warps and 2
    to 4 pipeline stages where the stages' operand tiles fit shared memory."""
    shapes = []
    for bm in (16, 32, 64, 128):
        for bn in (16, 32, 64, 128):
            for bk in (16, 32, 64):
                if (bm > max(16, tiling.next_pow2(a["m"])) or bn > max(16, tiling.next_pow2(a["n"]))
                        or bk > max(16, tiling.next_pow2(a["k"]))):
                    continue
                t = tiling.gemm_time(a["b"], a["m"], a["n"], a["k"], bm, bn, bk)
                if t is not None:
                    shapes.append((t, -(bm * bn * bk), bm, bn, bk))
    best = [s[2:] for s in sorted(shapes)[:4]]
    for stages, warps in _STAGES_WARPS:       # the shapes vary fastest: a limit keeps them all
        for bm, bn, bk in best:
            if tiling.gemm_time(a["b"], a["m"], a["n"], a["k"], bm, bn, bk, stages) is not None:
                yield {"BM": bm, "BN": bn, "BK": bk, "num_warps": warps, "num_stages": stages}


def _attention_space(k: Kernel, a: dict):
    """The four cheapest (BM, BN) under tiling.attention_time, with 4 or 8 warps and 1 to 3
    stages for the K/V loop (one fewer than a gemm's: its loop holds two tiles, K and V)."""
    shapes = []
    for bm in (16, 32, 64, 128):
        for bn in (16, 32, 64, 128):
            if bm > max(16, tiling.next_pow2(a["m"])) or bn > max(16, tiling.next_pow2(a["n"])):
                continue
            t = tiling.attention_time(a["b"], a["m"], a["n"], a["d"], a["e"], bm, bn, k.elements_read)
            if t is not None:
                shapes.append((t, -(bm * bn), bm, bn))
    best = [s[2:] for s in sorted(shapes)[:4]]
    for stages, warps in _STAGES_WARPS:
        for bm, bn in best:
            yield {"BM": bm, "BN": bn, "num_warps": warps, "num_stages": max(1, stages - 1)}


def _reduce_space(k: Kernel, a: dict):
    """Rows per program (1 to 16, at most 8192 elements in registers) with 2, 4 or 8 warps;
    the chunk stays the roofline's (the row, up to 1024 columns)."""
    bc = int(k.tiles["BC"])
    for br in (1, 2, 4, 8, 16):
        if br * bc > 8192 or br > max(1, tiling.next_pow2(a["r"])):
            continue
        for warps in (4, 2, 8):
            yield {"BR": br, "num_warps": warps}


def _elementwise_space(k: Kernel, a: dict):
    """Elements per program 256 to 4096 (no more than the output rounded up to a power of
    two), with 4 or 8 warps."""
    for block in (1024, 512, 2048, 256, 4096):
        if block <= max(128, tiling.next_pow2(a["o"])):
            for warps in (4, 8):
                yield {"BLOCK": block, "num_warps": warps}


_SPACES = {"gemm": _gemm_space, "attention": _attention_space, "reduce": _reduce_space,
           "elementwise": _elementwise_space}


# ---- the cache -------------------------------------------------------------------------------

def _slug(gpu: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", gpu).strip("_") or "gpu"


def _valid_entry(entry) -> bool:
    """An entry is {"kind", "tiles": {NAME: positive int}, "us": positive number, ...}."""
    if not isinstance(entry, dict) or entry.get("kind") not in TILE_KEYS:
        return False
    tiles = entry.get("tiles")
    if not isinstance(tiles, dict) or not tiles:
        return False
    allowed = TILE_KEYS[entry["kind"]] | LAUNCH_KEYS
    if any(k not in allowed or type(v) is not int or v <= 0 for k, v in tiles.items()):
        return False
    us = entry.get("us")
    return isinstance(us, (int, float)) and math.isfinite(us) and us > 0


class TuningCache:
    """Tuned tiles of one GPU (its name as torch.cuda.get_device_name gives it), by
    kernel_key. `path` defaults to <user cache>/apsat/tuning/<gpu>.json. Reading never
    raises for a damaged file: a file that is not the cache's JSON, or entries that are
    not tiles, are left out with one warning, and the next `put` writes a sound file."""

    def __init__(self, gpu: str, path=None):
        self.gpu = gpu
        if path is None:
            from apsat.backends.gpu.files import cache_dir

            path = cache_dir("tuning") / f"{_slug(gpu)}.json"
        self.path = Path(path)
        self.entries = self._read()

    def _read(self, quiet: bool = False) -> dict:
        """The file's sound entries; warns (unless quiet) about what it leaves out."""
        warn = (lambda text: None) if quiet else (lambda text: warnings.warn(text, stacklevel=4))
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            warn(f"{self.path}: not a tuning cache ({type(e).__name__}); tuning starts afresh")
            return {}
        entries = data.get("entries") if isinstance(data, dict) else None
        if not isinstance(entries, dict) or data.get("format") != FORMAT:
            warn(f"{self.path}: not a tuning cache of format {FORMAT}; tuning starts afresh")
            return {}
        good = {k: v for k, v in entries.items() if _valid_entry(v)}
        if len(good) < len(entries):
            warn(f"{self.path}: {len(entries) - len(good)} malformed entries ignored")
        return good

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, key: str) -> bool:
        return key in self.entries

    def tiles(self, k: Kernel) -> dict | None:
        """The tuned tiles of kernel `k`, or None when its shape was never tuned here."""
        entry = self.entries.get(kernel_key(k))
        return None if entry is None or entry["kind"] != k.kind else dict(entry["tiles"])

    def put(self, key: str, kind: str, tiles: dict, us: float, **facts) -> None:
        """Record `tiles` (plain_tiles) as kernel `key`'s best, `us` microseconds, with
        `facts` (default_us, tried, ...), and write the file: merged with what another
        process wrote meanwhile, replaced atomically."""
        entry = {"kind": kind, "tiles": plain_tiles(tiles), "us": float(us), **facts,
                 "when": time.strftime("%Y-%m-%dT%H:%M:%S")}
        if not _valid_entry(entry):
            raise ValueError(f"tuning cache: not an entry for a {kind} kernel: {entry}")
        self.entries = {**self._read(quiet=True), **self.entries, key: entry}
        text = json.dumps({"format": FORMAT, "gpu": self.gpu, "entries": self.entries}, indent=1,
                          sort_keys=True)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(text + "\n")
        os.replace(tmp, self.path)


def current_gpu() -> str | None:
    """The name of the GPU torch sees (device 0), or None without torch or a GPU."""
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def tuned_cache(gpu: str | None = None) -> TuningCache | None:
    """The tuning cache of `gpu`, or of the GPU torch sees when None; None without either
    (kernels then take the roofline's tiles)."""
    gpu = gpu or current_gpu()
    return TuningCache(gpu) if gpu else None
