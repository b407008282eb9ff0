"""apsat: equality saturation for tensor programs over Glenside-style access patterns.

Public API: parse, Program, EGraph, extract, evaluate, load_onnx, optimize, ApsatError,
InternalError (a bug in apsat, not bad input: not an ApsatError).
The heavier parts (egglog, onnx, onnxruntime) load on first use.
"""
from apsat.lang.program import Program, parse
from apsat.errors import ApsatError, InternalError
from apsat.extract import extract  # binds the name over the subpackage attribute of the same name

__all__ = ["Program", "parse", "EGraph", "extract", "evaluate", "load_onnx", "optimize", "ApsatError",
           "InternalError"]

_LAZY = {
    "EGraph": ("apsat.explore.egraph", "EGraph"),
    "evaluate": ("apsat.lang.evaluate", "evaluate"),
    "load_onnx": ("apsat.frontend.importer", "load_onnx"),
    "optimize": ("apsat.pipeline.optimize", "optimize"),
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'apsat' has no attribute {name!r}")
