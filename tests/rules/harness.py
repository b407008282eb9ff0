"""Checks every rule must pass: soundness, reach, refusal.

`run_rule` saturates a small program with ONE rule (moved into a ruleset of its own) plus
the shape analysis; `helpers=` names helper rules of its family (e.g. im2col's `aux-*`
rules that build the shape lists it reads, see `helper_rules`) to load into that same
ruleset, and every check_* function passes `helpers=` through. Only the named rule's
matches count as "fired". `check_sound` then evaluates the original program and up to `samples`
extractable members of the root e-class (each member = one node of the root class, the
rest chosen by tree extraction) with the reference interpreter on seeded random inputs.
Tolerance rtol 1e-4 / atol 1e-5: rewrites re-associate float32 sums (a split dot-product
adds partial sums in another order), which moves results by a few ulps per term; a rule
that changes values by design (the precision family's rounding) passes its own `rtol` /
`atol` to check_sound.

Element types: `types=` gives the program's tensors their types (a dict name -> "f32" /
"f16" / "bf16", or one type name for every tensor; None, the default: untyped, so no
`has-type` fact holds), and `facts=` is egglog text loaded after the program is added
(e.g. apsat.pipeline.precision.facts("fp16"), the facts the precision rules read). The
reference evaluates the original and every member in those types.
"""
from __future__ import annotations

import re

import numpy as np

import apsat
from apsat.lang.evaluate import evaluate
from apsat.explore.egraph import EGraph
from apsat.lang.program import Program
from apsat.errors import RuleError
from apsat.rules.library import RuleLibrary
from apsat.pipeline.soundness import random_tensors, sample_members
from fresh import fresh_egraph

RTOL, ATOL = 1e-4, 1e-5
_LIBRARY = None


def library() -> RuleLibrary:
    """The built-in rule library (validated once per test session)."""
    global _LIBRARY
    if _LIBRARY is None:
        _LIBRARY = RuleLibrary()
    return _LIBRARY


def helper_rules(family: str, prefix: str = "aux-") -> list[str]:
    """Names of the built-in rules of `family` whose name (after `family/`) starts with
    `prefix`: a family's helper rules, which add no term but build facts its other rules
    read. An unknown family gives []."""
    return sorted(n for n in library().rules if n.startswith(f"{family}/{prefix}"))


def typed_program(text: str, shapes: dict, types=None, weights=()) -> Program:
    """`text` parsed with `shapes`; `types` (see the module doc) its tensor types."""
    program = apsat.parse(text, shapes)
    if isinstance(types, str):
        types = {name: types for name in shapes}
    return Program(program.outputs, program.tensor_shapes, weights=frozenset(weights),
                   tensor_types=dict(types or {}))


def run_rule(rule_name: str, text: str, shapes: dict, target: str = "gpu", iter_limit: int = 8,
             node_limit: int = 20_000, time_limit: float = 10.0, helpers=(), weights=(), types=None,
             facts: str = ""):
    """Add `text` to a fresh e-graph and saturate with rule `rule_name` alone, or with the
    rules named in `helpers` beside it in its one-rule ruleset (a helper equal to
    `rule_name` is loaded once). `weights` names the tensors known at load (the program's
    weights; rules that read weight-key need them); `types` and `facts`: see the module
    doc. Returns (eg, root handle, run report); the report's rule_matches count each rule
    by name, so `fired(report, rule_name)` still means the rule under test. RuleError for an unknown rule or helper name. The e-graph
    is fresh.fresh_egraph's: valid until the next call."""
    eg = fresh_egraph(target, declarations=True)
    root = eg.add(typed_program(text, shapes, types, weights))
    if facts:
        eg.load_text(facts, what=f"setting the facts of a test of {rule_name}")
    if helpers:
        lib = library()
        names = [rule_name] + [h for h in dict.fromkeys(helpers) if h != rule_name]
        missing = [n for n in names if n not in lib.rules]
        if missing:
            raise RuleError(f"unknown rule(s): {', '.join(missing)}")
        lib.load_into(eg, [])              # the families' declarations (helper functions)
        only = "only-" + re.sub(r"[^A-Za-z0-9]", "-", rule_name) + "-with-helpers"
        eg.load_text(f"(ruleset {only})\n" + "\n".join(lib.rules[n].text_in(only) for n in names),
                     what=f"loading rule {rule_name} with its helpers")
    else:
        only = library().load_single_rule(eg, rule_name)
    report = eg.run([only], iter_limit=iter_limit, node_limit=node_limit, time_limit=time_limit)
    return eg, root, report


def fired(report: dict, rule_name: str) -> int:
    """How many matches the rule had."""
    return report["rule_matches"].get(rule_name, 0)


def members(eg, root: str, samples: int = 20) -> list[Program]:
    """Up to `samples` programs, one per node of the root e-class (acyclic ones only)."""
    return sample_members(eg, root, samples)


def check_sound(rule_name: str, text: str, shapes: dict, target: str = "gpu", seed: int = 0,
                samples: int = 20, inputs: dict | None = None, rtol: float | None = None,
                atol: float | None = None, **limits) -> int:
    """Assert the rule fires and every sampled member of the root e-class equals the
    original program numerically (within `rtol` / `atol`, default RTOL / ATOL); returns
    the number of members compared (>= 2).
    `limits` (here and in the other check_* functions) go to run_rule: iter_limit,
    node_limit, time_limit, helpers, weights, types, facts."""
    eg, root, report = run_rule(rule_name, text, shapes, target, **limits)
    assert fired(report, rule_name), f"{rule_name} did not fire on {text}"
    tensors = inputs or random_tensors(shapes, seed)
    want = evaluate(typed_program(text, shapes, limits.get("types")), tensors)
    progs = members(eg, root, samples)
    assert len(progs) >= 2, f"{rule_name}: the root e-class has no second member to compare"
    for prog in progs:
        got = evaluate(prog, tensors)
        np.testing.assert_allclose(got, want, rtol=RTOL if rtol is None else rtol,
                                   atol=ATOL if atol is None else atol,
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
    want = evaluate(typed_program(text, shapes, limits.get("types")), tensors)
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
