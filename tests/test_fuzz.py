"""The fuzz (benchmarks/fuzz.py): a seeded sample of 50 malformed models and rule files,
mixed families, runs through the CLI in subprocesses under the fuzz's limits (60 s, 4 GiB
of address space each) and every one ends cleanly: refused with one `apsat:` line, or
accepted. No crash, hang or memory overrun. About 40 s on 2 cores. The full run (700
cases) and its table are in docs/verification.md."""
from __future__ import annotations


import pytest

from bench_scripts import load_benchmark as _load


fuzz = _load("fuzz")

PROGRESS = "model: import " + "━" * 40 + " 1/1 0:00:00"
TRACEBACK = 'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\nValueError: bad\n'


@pytest.mark.parametrize("rc, stderr, outcome", [
    (2, f"{PROGRESS}\napsat: model: m.onnx: Relu node 0: bad\n", "refused"),
    (2, "apsat: model: note: input 'x' axis 0: symbolic dim 'N' set to 1\napsat: m.onnx: bad\n", "refused"),
    (0, PROGRESS + "\n", "accepted"),
    (1, PROGRESS + "\n", "accepted"),
    (1, "apsat: model: verification failed: max error 3.0\n", "accepted"),
    (2, "apsat: one\napsat: two\n", "crashed"),
    (2, "usage: apsat [-h]\napsat: error: unrecognized arguments\n", "crashed"),
    (0, "/x/semantics.py:167: RuntimeWarning: invalid value\n  r = np.matmul(lhs, rhs)\n", "crashed"),
    (1, TRACEBACK, "crashed"),
    (2, "thread 'main' panicked at src/lib.rs:1:1:\n", "crashed"),
    (-11, "", "crashed"),
    (3, "apsat: x\n", "crashed"),
    (None, "", "hung"),
    (1, TRACEBACK.replace("ValueError: bad", "MemoryError: Unable to allocate 4.00 TiB"), "memory"),
    (-6, "memory allocation of 8589934592 bytes failed\n", "memory"),
])
def test_classify(rc, stderr, outcome):
    assert fuzz.classify(rc, stderr)[0] == outcome


def test_classify_names_the_exception_of_a_traceback():
    assert fuzz.classify(1, TRACEBACK) == ("crashed", "ValueError: bad")


def test_cases_are_deterministic_and_mixed():
    cases = fuzz.sample_cases(fuzz.make_cases(500, 200, seed=0), 50, seed=0)
    assert cases == fuzz.sample_cases(fuzz.make_cases(500, 200, seed=0), 50, seed=0)
    assert len({c.family for c in cases}) >= 15 and {c.kind for c in cases} == {"model", "rules"}
    assert all(c.data() == c.data() for c in cases[:10])


@pytest.mark.slow
def test_a_seeded_sample_ends_cleanly():
    cases = fuzz.sample_cases(fuzz.make_cases(500, 200, seed=0), 50, seed=0)
    results = fuzz.run_all(cases, jobs=2)
    assert len(results) == 50
    bad = fuzz.failures(results)
    assert not bad, "\n".join(["cases that did not end cleanly:"] + bad)
    assert all(r.outcome in fuzz.CLEAN for r in results)
