"""ONNX out: an extracted program written back as an ONNX model that onnxruntime runs.

    model_proto = export_onnx(program, model, metadata)   # apsat.backends.onnx.export

graph.py holds the graph being written and the lazy-layout values; views.py the access
ops; fold.py the weight-only work done at export; compute.py, contract.py and pool.py the
kernels' ONNX forms; walk.py the walk over the program; tidy.py the clean-ups after it;
fuse.py and fuse_seq.py fold what the extractor left unfused into onnxruntime's fused ops,
reading the written graph through peep.py.
"""
from apsat.backends.onnx.export import export_onnx
from apsat.backends.onnx.views import ExportError

__all__ = ["export_onnx", "ExportError"]
