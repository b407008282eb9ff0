"""Numerical soundness of rewrite rules: does every program a rule makes equal the original?

`check_soundness(text, shapes, rules)` adds a small program to a fresh e-graph, saturates
it with the given rules, samples up to `samples` extractable members of the root e-class
(each one node of the root class, the rest chosen by tree extraction) and evaluates each
with the reference interpreter on seeded random inputs against the original program.

Tolerance rtol 1e-4, atol 1e-5 by default: rewrites re-associate float32 sums (a split
dot-product adds partial sums in another order), which moves results by a few ulps per
term; a wrong rule moves them by far more. The test suite's rule harness uses the same
sampling (tests/rules/harness.py).
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field

import numpy as np

from apsat.lang.evaluate import evaluate
from apsat.lang.program import Program, parse
from apsat.extract.check import InvalidExtraction, check_extraction
from apsat.extract.decode import decode, language_graph
from apsat.extract.tree import extract_tree

RTOL, ATOL = 1e-4, 1e-5


def sample_members(eg, root: str, samples: int = 20) -> list[Program]:
    """Up to `samples` programs, one per node of the root e-class (acyclic ones only),
    the rest of each chosen by tree extraction."""
    graph = language_graph(eg.serialize())
    cls = eg.class_of(root)
    base = extract_tree(graph, [cls])
    out = []
    for node in sorted(graph.classes[cls])[:samples]:
        choice = dict(base)
        choice[cls] = node
        if any(k not in choice for k in graph.node_classes[node]):
            continue  # a child class with no finite program
        try:
            check_extraction(graph, choice, [cls])
        except InvalidExtraction:
            continue  # this member only exists through a cycle
        out.append(Program({"out": decode(graph, choice, [cls])[cls]}, dict(eg.tensor_shapes)))
    return out


def random_tensors(shapes: dict, seed: int = 0, positive: bool = False) -> dict:
    """Seeded standard-normal float32 tensors (|x| + 0.5 with `positive`, for rules whose
    condition needs positive data, e.g. around sqrt or division)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, dims in shapes.items():
        x = rng.standard_normal(dims).astype(np.float32)
        out[name] = np.abs(x) + 0.5 if positive else x
    return out


@dataclass
class SoundnessReport:
    """`ok` when every sampled member matched; `compared` members were evaluated;
    `worst` is the largest absolute error seen; `failure` describes the first mismatch."""

    rules: list
    compared: int
    ok: bool
    worst: float
    rule_matches: dict = field(default_factory=dict)
    failure: str | None = None

    def __str__(self) -> str:
        fired = ", ".join(f"{r} ({n})" for r, n in self.rule_matches.items() if n) or "none"
        if self.ok:
            return (f"sound: {self.compared} member(s) of the root e-class equal the original "
                    f"(max abs err {self.worst:.2e}); rules that fired: {fired}")
        return f"UNSOUND: {self.failure}; rules that fired: {fired}"

    def _repr_html_(self) -> str:
        colour = "#2ca02c" if self.ok else "#d62728"
        return f"<pre style='color:{colour}'>{html.escape(str(self))}</pre>"


def check_soundness(program, shapes: dict, rules, target: str = "gpu", seed: int = 0, samples: int = 20,
                    rtol: float = RTOL, atol: float = ATOL, positive: bool = False, library=None,
                    **limits) -> SoundnessReport:
    """Saturate `program` (surface syntax or a Program) with `rules` (ruleset names or
    rule-file paths, as EGraph.saturate takes them; `library` a RuleLibrary holding user
    files) and compare up to `samples` members of the root e-class with the original on
    seeded random inputs. Never raises for a mismatch: the report says what differed."""
    from apsat.egraph.driver import EGraph
    from apsat.rules.saturate import saturate

    original = parse(program, shapes) if isinstance(program, str) else program
    eg = EGraph(target=target)
    if library is not None:
        eg.library = library
    root = eg.add(original)
    report = saturate(eg, rules, **limits)
    matches: dict = {}
    for phase in report["phases"]:
        for rule, n in phase["rule_matches"].items():
            matches[rule] = matches.get(rule, 0) + n
    tensors = random_tensors(shapes, seed, positive)
    want = np.asarray(evaluate(original, tensors))
    members = sample_members(eg, root, samples)
    worst = 0.0
    for member in members:
        got = np.asarray(evaluate(member, tensors))
        err = float(np.max(np.abs(got - want))) if got.size else 0.0
        worst = max(worst, err)
        if got.shape != want.shape or not np.allclose(got, want, rtol=rtol, atol=atol):
            failure = (f"member {member.to_text()[:200]} differs from the original: max abs err {err:.3g} "
                       f"(rtol {rtol:g}, atol {atol:g})")
            return SoundnessReport(list(rules), len(members), False, worst, matches, failure)
    return SoundnessReport(list(rules), len(members), True, worst, matches)
