"""Every kernel kind, generated and run under the Triton interpreter, equals the reference
interpreter on seeded random inputs (sizes not multiples of the tiles). Cases and
tolerances: gpu_cases.py."""
from __future__ import annotations

import pytest
from gpu_cases import KERNELS, assert_close, inputs_for

import apsat
from apsat.backends.gpu.lower import lower


@pytest.mark.parametrize("case", sorted(KERNELS))
def test_kernel_matches_reference(case, triton_run):
    text, shapes, kinds = KERNELS[case]
    program = apsat.parse(text, shapes)
    graph = lower(program)
    assert [k.kind for k in graph.kernels] == kinds
    assert not graph.host_steps
    tensors = inputs_for(case, program)
    assert_close(triton_run(program, tensors), apsat.evaluate(program, tensors))


def test_given_tiles_smaller_than_the_problem(triton_run):
    """Tiles passed by the caller (several tiles in M, N and K, ragged edges) give the same
    numbers as the searched ones."""
    text, shapes, _ = KERNELS["gemm-residual"]
    program = apsat.parse(text, shapes)
    tiles = {"gemm": {"BM": 16, "BN": 16, "BK": 16}}
    assert lower(program, tiles).kernels[0].tiles["BK"] == 16
    tensors = inputs_for("gemm-residual", program)
    assert_close(triton_run(program, tensors, tiles=tiles), apsat.evaluate(program, tensors))


def test_reduction_rows_split_over_programs(triton_run):
    """One row per program and 16-column chunks: many programs, many chunks per row."""
    text, shapes, _ = KERNELS["softmax-long-rows"]
    program = apsat.parse(text, shapes)
    tensors = inputs_for("softmax-long-rows", program)
    got = triton_run(program, tensors, tiles={"reduce": {"BR": 2, "BC": 256}})
    assert_close(got, apsat.evaluate(program, tensors))


def test_several_outputs(triton_run):
    """A program with two outputs, one a view of the other's input (copied out)."""
    from apsat.lang.program import Program
    from apsat.lang.syntax import parse_term

    relu = parse_term("(compute relu (access-tensor x))")
    view = parse_term("(access-transpose (access-tensor x) (list 1 0))")
    program = Program({"a": relu, "b": view}, {"x": (5, 19)})
    tensors = inputs_for("", program)
    got = triton_run(program, tensors)
    want = apsat.evaluate(program, tensors)
    assert set(got) == {"a", "b"}
    for name in want:
        assert_close(got[name], want[name])
