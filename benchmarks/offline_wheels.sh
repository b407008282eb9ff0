#!/usr/bin/env bash
# Wheels for running apsat's GPU benchmark on a GPU machine that has Python 3.12, torch,
# triton, onnx, onnxruntime and cuda-bindings but no network: apsat's own dependencies
# that such an image lacks, and what egglog imports when it loads.
#   bash benchmarks/offline_wheels.sh [DIR]          (default DIR: .whl)
# There: pip install --no-index --no-deps --target SITE DIR/*.whl; PYTHONPATH=SITE:. python benchmarks/gpu.py ...
set -euo pipefail
dir="${1:-.whl}"
mkdir -p "$dir"
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any -d "$dir" \
  egglog==13.2.0 highspy==1.16.0 platformdirs black pytokens graphviz opentelemetry-api
du -sh "$dir"
