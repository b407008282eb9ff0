"""One model's row of benchmarks/gpu.py: apsat's kernels and the baselines, timed and checked.

    measure(name, opts) -> row     (run by gpu.py in a process of its own per model)

Columns (milliseconds per inference, median of opts.iters runs after opts.warmup runs; on a
GPU, CUDA events around each run, inputs already on the GPU, weights prepared once):
    triton, triton_graph    apsat's Triton kernels (the generated runner), plain and
                            replayed as one CUDA graph (runner.capture)
    cuda, cuda_graph        apsat's CUDA C kernels (nvcc's cubins), plain and as a graph
    eager                   PyTorch eager: the ONNX graph run op by op (torch_onnx.py)
    compile                 torch.compile of that module (opts.compile_mode)
    ort_cuda                onnxruntime's CUDA execution provider (I/O bound on the GPU;
                            wall clock, as its run returns after the GPU is done)
Each column's outputs are checked against onnxruntime on the CPU (apsat.pipeline.verify's
tolerances; a float16 model, NAME_fp16, by verify's float64 rule: the error against a
float64 run at most 8x onnxruntime's own float16 error plus 8 ulps of float16); a column that
fails, or cannot run here, says why in row["notes"] and has no time. Per kernel: apsat/backends/gpu/profile.py's rows (measured against modelled).
Without a GPU the apsat columns run under the Triton interpreter and wall clock: that
checks the harness, and the times mean nothing.
"""
from __future__ import annotations

import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gpu_models  # noqa: E402


def _load_sibling(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", HERE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def median_ms(fn, iters: int, warmup: int, gpu: bool) -> float:
    """Median milliseconds of fn over `iters` runs after `warmup` runs: CUDA events
    around each run on a GPU (one synchronisation at the end), else the wall clock."""
    for _ in range(warmup):
        fn()
    if not gpu:
        times = []
        for _ in range(iters):
            t = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t))
        return statistics.median(times)
    import torch

    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events)


def _error(want, got: dict) -> tuple[bool, float]:
    """(within apsat.pipeline.verify's tolerances, largest absolute error) of got against
    want: onnxruntime's outputs, or for a half model its verify.Oracle, judged by the
    float64 rule as verification judges outputs computed in float16 (8 ulps of the type:
    onnxruntime's CPU run of a float16 model computes the nodes it has no float16 kernel
    for in float32, so its own error understates a float16 computation by 10x and more)."""
    from apsat.pipeline.verify import Oracle, compare, judge

    got = {k: np.asarray(v.detach().float().cpu() if hasattr(v, "detach") else v, np.float32)
           for k, v in got.items()}
    if isinstance(want, Oracle):
        v = judge(want, got, types=dict.fromkeys(want.float32, "f16"))
    else:
        v = compare(want, got)
    return bool(v.ok), float(v.max_abs_err)


def _column(row, col, run, outputs, want, opts, gpu):
    """Check then time one column: outputs() gives {output name: tensor} (and compiles or
    loads what it needs); run is the timed call."""
    try:
        ok, err = _error(want, outputs())
        row["err"][col] = err
        if not ok:
            row["notes"].append(f"{col}: outputs differ from onnxruntime (max abs error {err:.2e})")
            return
        row["ms"][col] = median_ms(run, opts.iters, opts.warmup, gpu)
    except Exception as e:  # noqa: BLE001 -- one column's failure is that cell's note
        row["notes"].append(f"{col}: {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}")


def apsat_columns(row, res, inputs, want, opts, gpu, device):
    """The triton, triton_graph, cuda and cuda_graph columns and the per-kernel rows."""
    from apsat.backends.gpu.lower import lower
    from apsat.backends.gpu.profile import cuda_timer, profile, wall_timer
    from apsat.backends.gpu.runner import load_runner
    from apsat.backends.gpu.tuning import tuned_cache
    from apsat.backends.gpu.write import write_kernels

    cache = tuned_cache() if gpu else None
    graph = lower(res.program, tuned=cache)
    tensors = {**res.model.weights, **inputs}
    timer = cuda_timer() if gpu else wall_timer(1)
    t = time.perf_counter()
    row["kernel_rows"] = profile(graph, tensors, timer, cache=cache, tune=opts.tune and gpu, limit=opts.limit,
                                 device=device)
    row["seconds"]["profile"] = time.perf_counter() - t
    if opts.tune and gpu:
        graph = lower(res.program, tuned=cache)          # with the tiles just found
    folder = Path(tempfile.mkdtemp(prefix="apsat-gpu-bench-"))
    t = time.perf_counter()
    report = write_kernels(res.program, folder, graph=graph, compile={"cuda"} if gpu else False)
    row["seconds"]["nvcc"] = time.perf_counter() - t
    row.update(kernels=len(graph.kernels), host_steps=len(graph.host_steps),
               modelled_ms=report["totals"]["modelled_us"] / 1e3)
    runner = load_runner(folder)            # written just now, by this process
    prepared = runner.prepare(tensors, device)
    import torch

    # float16 inputs stay float16 (the runner's buffers are), so no conversion is timed
    per_call = {k: torch.as_tensor(np.asarray(v, np.float16 if v.dtype == np.float16 else np.float32)).to(device)
                for k, v in inputs.items()}
    for kernels in ("triton", "cuda") if gpu else ("triton",):
        def call(kernels=kernels):
            return runner.run(per_call, device, prepared, kernels)
        _column(row, kernels, call, call, want, opts, gpu)
        if gpu and kernels in row["ms"]:        # a graph of what ran plainly
            replay = {}

            def graphed(kernels=kernels):
                replay.setdefault("f", runner.capture(per_call, device, prepared, kernels))
                return replay["f"]()
            _column(row, f"{kernels}_graph", graphed, graphed, want, opts, gpu)


def torch_columns(row, model, inputs, want, opts, gpu, device):
    """The eager and compile columns: the ONNX graph as a torch module, and compiled."""
    import torch

    from apsat.frontend.reading import half_float_types

    torch_onnx = _load_sibling("torch_onnx")
    # a float16 model (NAME_fp16) runs as a float16 module: torch.compile in fp16
    dtype = torch.float16 if "float16" in half_float_types(model) else torch.float32
    module = torch_onnx.to_torch(model, device=device, dtype=dtype, input_shapes={k: v.shape for k, v in inputs.items()})
    names = [i.name for i in model.graph.input if i.name in inputs]
    args = [torch.as_tensor(inputs[n]).to(device) for n in names]
    outs = [o.name for o in model.graph.output]

    def named(fn):
        def call():
            with torch.no_grad():
                got = fn(*args)
            return dict(zip(outs, got if isinstance(got, (tuple, list)) else (got,)))
        return call
    eager = named(module)
    _column(row, "eager", eager, eager, want, opts, gpu)
    if opts.compile_mode == "none":
        return
    compiled = named(torch.compile(module, mode=opts.compile_mode))
    t = time.perf_counter()
    _column(row, "compile", compiled, compiled, want, opts, gpu)
    row["seconds"]["torch_compile"] = time.perf_counter() - t


def ort_cuda_column(row, model, inputs, want, opts):
    """onnxruntime with CUDAExecutionProvider, when the installed onnxruntime has it."""
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        row["notes"].append("ort_cuda: this onnxruntime has no CUDAExecutionProvider")
        return
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CUDAExecutionProvider"])
    binding = sess.io_binding()
    for name, x in inputs.items():
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(x), "cuda", 0))
    outs = [o.name for o in sess.get_outputs()]
    for name in outs:
        binding.bind_output(name, "cuda")

    def run():
        sess.run_with_iobinding(binding)
        return dict(zip(outs, binding.copy_outputs_to_cpu()))
    _column(row, "ort_cuda", lambda: sess.run_with_iobinding(binding), run, want, opts, False)


def measure(name: str, opts) -> dict:
    """The row of model `name` (see the module doc)."""
    import torch

    import apsat
    from apsat.pipeline.zoo import ort_run

    gpu = torch.cuda.is_available() and not opts.cpu
    device = "cuda" if gpu else "cpu"
    row = {"model": name, "device": torch.cuda.get_device_name() if gpu else "cpu (Triton interpreter)",
           "ms": {}, "err": {}, "notes": [], "seconds": {}}
    model, inputs = gpu_models.load(name)
    if name.endswith(gpu_models.HALF_SUFFIX):
        from apsat.pipeline.verify import run_oracle

        want = run_oracle(model, inputs)
    else:
        want = ort_run(model, inputs)
    t = time.perf_counter()
    res = apsat.optimize(model, target="gpu", verify=False, inputs=inputs,
                         input_shapes={k: v.shape for k, v in inputs.items()})
    row["seconds"]["optimize"] = time.perf_counter() - t
    apsat_columns(row, res, inputs, want, opts, gpu, device)
    if "torch" not in opts.skip:
        torch_columns(row, model, inputs, want, opts, gpu, device)
    if gpu and "ort" not in opts.skip:
        ort_cuda_column(row, model, inputs, want, opts)
    return row
