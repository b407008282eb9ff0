"""Every backend behind one interface (apsat/backends/base.py): the pipeline lowers with the
target's backend, reports what lowering says, and verifies the backend's run beside the
reference interpreter's."""
import numpy as np
import onnx
import pytest

from models import single_op

from apsat.backends import backend_for
from apsat.backends.reference import ReferenceBackend
from apsat.errors import ApsatError
from apsat.pipeline.optimize import optimize
from apsat.targets import parse_target


@pytest.fixture
def relu_model(tmp_path):
    path = tmp_path / "relu.onnx"
    onnx.save(single_op("Relu", [(4, 37)]), str(path))
    return str(path)


def test_each_target_has_its_backend():
    assert backend_for(parse_target("gpu")).name == "gpu_kernels"
    assert backend_for(parse_target("systolic:32x32")).name == "systolic"


def test_options_are_checked_before_any_work():
    with pytest.raises(ApsatError, match="no lowering option.*warp.*known: im2col"):
        backend_for(parse_target("systolic:32x32")).check_options({"warp": 1})
    with pytest.raises(ApsatError, match="it takes none"):
        ReferenceBackend().check_options({"im2col": "gather"})


def test_gpu_lowering_is_reported_without_writing_anything(relu_model, tmp_path):
    res = optimize(relu_model, target="gpu", verify=False)
    (kernel,) = res.report["gpu_kernels"]["kernels"]
    assert kernel["kind"] == "elementwise" and kernel["cuda"]["registers"] is None
    assert res.report["gpu_kernels"]["totals"]["kernels"] == 1
    assert not any(tmp_path.glob("**/kernels"))


def test_gpu_verification_says_why_the_kernels_did_not_run_here(relu_model):
    res = optimize(relu_model, target="gpu")
    assert res.report["verification"]["ok"]
    run = res.report["gpu_kernels"]["run"]
    try:
        import torch
    except ImportError:
        assert "torch is not installed" in run["skipped"] and res.backend_outputs is None
        return
    if torch.cuda.is_available():
        assert run["ok"], run
    else:
        assert "no GPU here" in run["skipped"] and res.backend_outputs is None


def test_gpu_kernels_run_and_verify_when_asked(relu_model):
    pytest.importorskip("torch", reason="the gpu extra (torch) is not installed")
    pytest.importorskip("triton", reason="the gpu extra (triton) is not installed")
    res = optimize(relu_model, target="gpu", verify_backend=True)
    run = res.report["gpu_kernels"]["run"]
    assert run["ok"] and run["outputs"] == list(res.program.outputs), run
    (out,) = res.backend_outputs.values()
    assert out.shape == (4, 37) and np.all(out >= 0)


def test_reference_backend_runs_the_program_itself(relu_model):
    res = optimize(relu_model, target="gpu", verify=False)
    backend = ReferenceBackend()
    lowered = backend.lower(res.program, parse_target("gpu"), res.model.weights, {})
    x = np.random.default_rng(0).standard_normal((4, 37)).astype(np.float32)
    (name,) = res.program.outputs
    got = backend.run(lowered, {**res.model.weights, **{next(iter(res.model.inputs)): x}})
    assert np.array_equal(got[name], np.maximum(x, 0))
