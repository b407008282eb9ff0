"""The ONNX front end: ONNX models to Programs (lowering, constant folding, shape inference)."""
