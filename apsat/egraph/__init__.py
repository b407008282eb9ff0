"""The access-pattern language, its e-graph driver and the ONNX importer."""
