"""Numerical soundness of rewrite rules: does every program a rule makes equal the original?

`check_soundness(text, shapes, rules)` adds a small program to a fresh e-graph, saturates
it with the given rules, samples up to `samples` extractable members of the root e-class
(each one node of the root class, the rest chosen by tree extraction) and evaluates each
with the reference interpreter on seeded random inputs against the original program.

Tolerance rtol 1e-4, atol 1e-5 by default: rewrites re-associate float32 sums (a split
dot-product adds partial sums in another order), which moves results by a few ulps per
term; a wrong rule moves them by far more. The test suite's rule harness uses the same
sampling (tests/rules/harness.py).

`check_user_rules(eg, model, rules)` is the same question asked after `optimize` saturated
a model with the user's own rule files, on the model at hand: where did those rules merge
e-classes, and do the members there compute what the original did? (docs/rules.md, "Your
rules checked on your model", has the strategy and its limits.)
"""
from __future__ import annotations

import html
import random
import time
from dataclasses import dataclass, field

import numpy as np

from apsat.egraph.serialize import EGG_TO_REGISTRY, SORT_OF
from apsat.errors import ApsatError, UnsoundRuleError
from apsat.lang.evaluate import evaluate
from apsat.lang.program import Program, parse
from apsat.lang.syntax import to_text
from apsat.lang.term import ATTRIBUTE_OPS, Term, postorder
from apsat.extract.check import InvalidExtraction, check_extraction
from apsat.extract.decode import decode, expr_child_classes, language_graph, node_args
from apsat.extract.tree import extract_tree
from apsat.rules.loader import BUILTIN_DIR, positional
from apsat.rules.sexpr import Atom, Form, calls, read_forms

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
        out.append(Program({"out": decode(graph, choice, [cls])[cls]}, dict(eg.tensor_shapes),
                           tensor_types=dict(eg.tensor_types)))
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


# ---- user rules checked on the model at hand ---------------------------------------------

SITE = "?apsat_site"     # the probe variable bound to the class a rule merges into
# The most terms one evaluated member (or reference) may have between its node and the
# placeholders. Why: in a class that rewrites alone made (say NHWC copies of a network's
# layers) a member's children are new classes too, and their tree-extracted programs can
# run back through dozens of convolutions (light ResNet-50 with layout and fusion: up to
# 325 terms, 20 convolutions, seconds each); a rule's own right side is a few terms.
MAX_MEMBER_TERMS = 64


def user_rules(eg) -> list:
    """The rules (loader Rules) of the rule files in `eg.library` that are not built in:
    the files a `rules=` argument named, all of whose rulesets saturate() ran."""
    library = getattr(eg, "library", None)
    return [r for rf in (library.files if library else []) if rf.path.parent != BUILTIN_DIR for r in rf.rules]


def _expr_form(node) -> bool:
    """A pattern headed by an Expr constructor (not an operator, list or relation)."""
    return isinstance(node, Form) and SORT_OF.get(node.head) == "Expr"


def site_probes(rule) -> tuple[list[tuple[str, str]], set[str]]:
    """(probes, ops) for a loader Rule. probes: (query, site) pairs for EGraph.sites
    naming the classes the rule merges into: a rewrite's left side (a birewrite's right
    side too) bound to SITE with its :when facts, a `rule`'s query with the first
    argument of each `union` action. Only Expr-headed sides count: a rule that rewrites
    operators or lists, or only sets relations, has no probe. ops: the registry names of
    the constructors its right sides build (members made of them are checked first)."""
    form = read_forms(rule.text)[0]
    text = (lambda n: n.text if isinstance(n, Atom) else rule.text[n.start:n.end])
    pos = positional(form.items[1:])
    if form.head in ("rewrite", "birewrite") and len(pos) == 2:
        items = form.items[1:]
        when = next((items[i + 1] for i, it in enumerate(items[:-1])
                     if isinstance(it, Atom) and it.text == ":when"), None)
        facts = " ".join(text(f) for f in when.items) if isinstance(when, Form) else ""
        sides = pos if form.head == "birewrite" else pos[:1]
        probes = [(f"(= {SITE} {text(side)}) {facts}".strip(), SITE) for side in sides if _expr_form(side)]
        built = pos if form.head == "birewrite" else pos[1:]
    elif form.head == "rule" and len(pos) == 2 and all(isinstance(p, Form) for p in pos):
        unions = [a for a in pos[1].items if isinstance(a, Form) and a.head == "union" and len(a.items) == 3]
        query = " ".join(text(f) for f in pos[0].items)
        probes = [(query, text(u.items[1])) for u in unions
                  if isinstance(u.items[1], Atom) or _expr_form(u.items[1])]
        built = [pos[1]]
    else:
        return [], set()
    ops = {EGG_TO_REGISTRY.get(f.head, f.head) for side in built for f in calls(side) if f.head}
    return probes, ops


def check_user_rules(eg, model, rules, seed: int = 0, max_classes: int = 20, members: int = 3,
                     inputs: dict | None = None) -> dict:
    """Check `rules` (loader Rules from the user's files) on the saturated e-graph `eg`
    holding `model` (an apsat Model whose program was added to it).

    Sites: the Expr classes where a rule's left side (or union) matches now (EGraph.sites;
    a rule that fired merged its right side there). Up to `max_classes` of them are
    checked, in a seeded order, classes holding a term of the model first: up to
    `members` members of each (those built of the rule's right-side constructors first,
    then the smallest), each evaluated by the reference interpreter with its child
    classes fed the values of their original terms (else their tree-extracted programs,
    up to MAX_MEMBER_TERMS terms), are compared with the class's original term (a class
    made by rewrites alone: with its tree-extracted member) on seeded random inputs of
    the model's shapes (`inputs` instead when given), with apsat.pipeline.verify's
    tolerance. Raises UnsoundRuleError for the first mismatch, naming the rule that
    matched there; returns {"rules", "probed_rules", "sites", "classes_checked",
    "members_checked", "members_skipped" (over MAX_MEMBER_TERMS), "seconds"}."""
    from apsat.pipeline.inputs import random_inputs

    start = time.perf_counter()
    probes = [(rule, probe, ops) for rule in rules for probes, ops in [site_probes(rule)] for probe in probes]
    found = eg.sites([probe for _, probe, _ in probes]) if probes else []
    hit: dict[str, tuple] = {}
    for (rule, _, ops), classes in zip(probes, found):
        for cls in classes or ():
            hit.setdefault(cls, (rule, ops))
    rng = random.Random(seed)
    chosen, counts = [], (0, 0)
    if hit:
        mem = _Members(eg, model.program)
        order = sorted(sorted(hit), key=lambda c: (c not in mem.original, rng.random()))
        chosen = [c for c in order if c in mem.graph.classes][:max_classes]
        tensors = {**model.weights, **(inputs if inputs is not None else random_inputs(model, seed))}
        counts = _check_sites(mem, {c: hit[c] for c in chosen}, tensors, rng, members)
    probed = {rule.name for (rule, _, _), classes in zip(probes, found) if classes is not None}
    return {"rules": len(rules), "probed_rules": len(probed), "sites": len(hit), "classes_checked": len(chosen),
            "members_checked": counts[0], "members_skipped": counts[1],
            "seconds": round(time.perf_counter() - start, 4)}


class _Members:
    """Members of e-classes as small programs: each Expr child class that holds a term of
    the original program is a placeholder tensor fed that term's value, so a member is
    judged on what it computes from correct inputs, whatever other classes hold."""

    def __init__(self, eg, program: Program):
        self.program = program
        self.graph = language_graph(eg.serialize())
        self.base = extract_tree(self.graph)
        self.class_of: dict[Term, str] = {t: eg.class_of(eg.handle_of(t)) for t in program.terms()}
        self.original: dict[str, Term] = {}
        for term, cls in self.class_of.items():
            self.original.setdefault(cls, term)
        self.leaves: dict[str, Term] = {}      # class -> its placeholder term
        self.shapes: dict[str, tuple] = {}     # placeholder tensor -> dims

    def leaf(self, cls: str) -> Term:
        if cls not in self.leaves:
            it, item = self.program.shape_of(self.original[cls])
            name = f"__class_{cls}"
            self.shapes[name] = tuple(it) + tuple(item)
            self.leaves[cls] = Term("access", (Term("access-tensor", (name,)), len(it)))
        return self.leaves[cls]

    def own(self, cls: str) -> Term:
        """The class's original term over placeholders (what its own node computes)."""
        def sub(a):
            if isinstance(a, Term) and a.op not in ATTRIBUTE_OPS:
                return self.leaf(self.class_of[a])
            return tuple(sub(b) for b in a) if isinstance(a, tuple) else a
        term = self.original[cls]
        return Term(term.op, tuple(sub(a) for a in term.args))

    def node_term(self, nid: str) -> Term:
        """Node `nid` over its child classes: placeholders, or tree-extracted programs
        down to placeholders. KeyError when a child class has no finite program."""
        terms: dict[str, Term] = {}
        stack = [(k, False) for k in expr_child_classes(self.graph, nid, self.base)]
        while stack:
            cls, ready = stack.pop()
            if cls in terms:
                continue
            if cls in self.original:
                terms[cls] = self.leaf(cls)
            elif ready:
                terms[cls] = self._build(self.base[cls], terms)
            else:
                stack.append((cls, True))
                stack.extend((k, False) for k in expr_child_classes(self.graph, self.base[cls], self.base))
        return self._build(nid, terms)

    def _build(self, nid: str, terms: dict) -> Term:
        return Term(self.graph.nodes[nid]["op"], node_args(self.graph, nid, terms.__getitem__, self.base))

    def priority(self, nid: str, ops: set) -> int:
        """How many of the rule's right-side constructors node `nid` shows (its own op, a
        compute node's operator)."""
        node = self.graph.nodes[nid]
        score = node["op"] in ops
        if node["op"] == "compute":
            op_cls = self.graph.node_classes[nid][0]
            score += any(self.graph.nodes[n]["op"] in ops for n in self.graph.classes[op_cls])
        return score

    def evaluate(self, term: Term, tensors: dict, values: dict) -> np.ndarray:
        shapes = {**self.program.tensor_shapes, **self.shapes}
        fed = {f"__class_{c}": values[c] for c in self.leaves}
        program = Program({"out": term}, shapes, self.program.opaque_nodes, tensor_types=self.program.tensor_types)
        return np.asarray(evaluate(program, {**tensors, **fed}))


def _pick(mem: _Members, cls: str, ops: set, rng, members: int) -> tuple[Term | None, list[Term]]:
    """(reference, up to `members` other members) of class `cls`: the reference is its
    original term over placeholders, or, for a class rewrites made, its tree-extracted
    member. Members made of the rule's right-side constructors come first, then the
    smallest (the fewest terms between the node and the placeholders: what a rule's right
    side builds over the classes it matched, and cheap to evaluate), ties in seeded order."""
    ref = mem.own(cls) if cls in mem.original else None
    if ref is None and cls in mem.base:
        ref = mem.node_term(mem.base[cls])
    ranked = []
    for nid in mem.graph.classes[cls]:
        try:
            term = mem.node_term(nid)
        except KeyError:
            continue          # a child class with no finite program
        if term is not ref:
            ranked.append((-mem.priority(nid, ops), len(postorder(term)), rng.random(), term))
    picked: list[Term] = []
    for *_, term in sorted(ranked, key=lambda r: r[:3]):
        if term not in picked:
            picked.append(term)
        if len(picked) == members:
            break
    return ref, picked


def _check_sites(mem: _Members, sites: dict, tensors: dict, rng, members: int) -> tuple[int, int]:
    """Evaluate and compare the members of the site classes (see check_user_rules);
    returns (members compared, members skipped for their size)."""
    from apsat.pipeline.verify import compare

    program = mem.program
    plans = [(cls, rule, *_pick(mem, cls, ops, rng, members)) for cls, (rule, ops) in sites.items()]
    needed = {c: mem.original[c] for c in [*mem.leaves, *(p[0] for p in plans)] if c in mem.original}
    values = evaluate(Program(needed, program.tensor_shapes, program.opaque_nodes,
                              tensor_types=program.tensor_types), tensors) if needed else {}
    values = values if isinstance(values, dict) else {next(iter(needed)): values}
    compared = skipped = 0
    for cls, rule, ref, picked in plans:
        small = [t for t in picked if len(postorder(t)) <= MAX_MEMBER_TERMS]
        skipped += len(picked) - len(small)
        if ref is None or len(postorder(ref)) > MAX_MEMBER_TERMS:
            skipped += len(small)
            continue
        want = values[cls] if cls in mem.original else mem.evaluate(ref, tensors, values)
        for term in small:
            compared += 1
            try:
                got = mem.evaluate(term, tensors, values)
            except ApsatError as exc:
                raise UnsoundRuleError(_unsound(rule, cls, term, ref, f"evaluating it failed: {exc}")) from None
            verdict = compare({"out": want}, {"out": got})
            if not verdict.ok:
                raise UnsoundRuleError(_unsound(rule, cls, term, ref, f"max abs err {verdict.max_abs_err:.3g} "
                                                f"(rtol {verdict.rtol:g}, atol {verdict.atol:g} x scale)"))
    return compared, skipped


def _unsound(rule, cls: str, term: Term, ref: Term, why: str) -> str:
    """The one-line UnsoundRuleError message."""
    def short(t):
        text = " ".join(to_text(t).split())
        return text if len(text) <= 100 else text[:97] + "..."
    return (f"{rule.path}:{rule.line}: rule '{rule.name}' is unsound on this model: in e-class {cls} "
            f"{short(term)} differs from the original {short(ref)}: {why}")
