"""Checks every rule must pass: soundness, reach, refusal.

`run_rule` saturates a small program with ONE rule (moved into a ruleset of its own) plus
the shape analysis. `check_sound` then evaluates the original program and up to `samples`
extractable members of the root e-class (each member = one node of the root class, the
rest chosen by tree extraction) with the reference interpreter on seeded random inputs.
Tolerance rtol 1e-4 / atol 1e-5: rewrites re-associate float32 sums (a split dot-product
adds partial sums in another order), which moves results by a few ulps per term.
"""
from __future__ import annotations

import numpy as np

import apsat
from apsat.backends.reference import evaluate
from apsat.egraph.egraph import EGraph
from apsat.egraph.program import Program
from apsat.extract.check import InvalidExtraction, check_extraction
from apsat.extract.decode import decode, language_graph
from apsat.extract.tree import extract_tree
from apsat.rules.library import RuleLibrary

RTOL, ATOL = 1e-4, 1e-5
_LIBRARY = None


def library() -> RuleLibrary:
    """The built-in rule library (validated once per test session)."""
    global _LIBRARY
    if _LIBRARY is None:
        _LIBRARY = RuleLibrary()
    return _LIBRARY


def run_rule(rule_name: str, text: str, shapes: dict, target: str = "gpu", iter_limit: int = 8,
             node_limit: int = 20_000, time_limit: float = 10.0):
    """Add `text` to a fresh e-graph and saturate with rule `rule_name` alone.
    Returns (eg, root handle, run report)."""
    eg = EGraph(target=target)
    root = eg.add(apsat.parse(text, shapes))
    only = library().load_single_rule(eg, rule_name)
    report = eg.run([only], iter_limit=iter_limit, node_limit=node_limit, time_limit=time_limit)
    return eg, root, report


def fired(report: dict, rule_name: str) -> int:
    """How many matches the rule had."""
    return report["rule_matches"].get(rule_name, 0)


def members(eg, root: str, samples: int = 20) -> list[Program]:
    """Up to `samples` programs, one per node of the root e-class (acyclic ones only)."""
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
        term = decode(graph, choice, [cls])[cls]
        out.append(Program({"out": term}, dict(eg.tensor_shapes)))
    return out


def random_tensors(shapes: dict, seed: int = 0, positive: bool = False) -> dict:
    rng = np.random.default_rng(seed)
    out = {}
    for name, dims in shapes.items():
        x = rng.standard_normal(dims).astype(np.float32)
        out[name] = np.abs(x) + 0.5 if positive else x
    return out


def check_sound(rule_name: str, text: str, shapes: dict, target: str = "gpu", seed: int = 0,
                samples: int = 20, inputs: dict | None = None, **limits) -> int:
    """Assert the rule fires and every sampled member of the root e-class equals the
    original program numerically; returns the number of members compared (>= 2)."""
    eg, root, report = run_rule(rule_name, text, shapes, target, **limits)
    assert fired(report, rule_name), f"{rule_name} did not fire on {text}"
    tensors = inputs or random_tensors(shapes, seed)
    want = evaluate(apsat.parse(text, shapes), tensors)
    progs = members(eg, root, samples)
    assert len(progs) >= 2, f"{rule_name}: the root e-class has no second member to compare"
    for prog in progs:
        got = evaluate(prog, tensors)
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL,
                                   err_msg=f"{rule_name} unsound: {prog.to_text()[:300]}")
    return len(progs)


def check_reaches(rule_name: str, text: str, shapes: dict, pattern: str, target: str = "gpu", **limits):
    """Assert the rule fires and `pattern` (surface syntax, ?vars) is in the root e-class."""
    eg, root, report = run_rule(rule_name, text, shapes, target, **limits)
    assert fired(report, rule_name), f"{rule_name} did not fire on {text}"
    assert eg.matches(pattern, root), f"{rule_name}: {pattern} not in the root e-class"
    return eg, root


def check_refuses(rule_name: str, text: str, shapes: dict, target: str = "gpu", **limits):
    """Assert the rule does not fire (its condition fails) and the e-graph is unchanged."""
    eg, root, report = run_rule(rule_name, text, shapes, target, **limits)
    assert not fired(report, rule_name), f"{rule_name} fired where its condition fails: {text}"
    assert report["nodes_after"] == report["nodes_before"]


def check_collapses(rule_name: str, text: str, shapes: dict, pattern: str, **limits):
    """For a rule that unions a term with one of its own sub-terms (the root e-class then
    has a single acyclic member, which check_sound cannot sample): the rule fires, that
    member is `pattern`, and it evaluates exactly equal to the original (pure data
    movement, no arithmetic)."""
    eg, root, report = run_rule(rule_name, text, shapes, **limits)
    assert fired(report, rule_name), f"{rule_name} did not fire on {text}"
    tensors = random_tensors(shapes)
    want = evaluate(apsat.parse(text, shapes), tensors)
    progs = members(eg, root)
    assert [p.to_text() for p in progs] == [pattern]
    np.testing.assert_array_equal(evaluate(progs[0], tensors), want)


def saturate_family(family: str, text: str, shapes: dict, **limits):
    """A fresh e-graph holding `text`, saturated with one whole built-in family.
    Returns (eg, root handle, run report)."""
    eg = EGraph()
    root = eg.add(apsat.parse(text, shapes))
    library().load_into(eg, [family])
    return eg, root, eg.run([family], **limits)
