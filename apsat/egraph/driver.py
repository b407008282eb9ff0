"""The e-graph driver: programs in, named rulesets run in bounded bursts, JSON out.

The language and its shape analysis live in language.egg and shape_rules.egg (egglog
text); this module feeds it through `egglog.bindings.EGraph`. Every distinct term of an
added program becomes one row `(set (handle N) <node>)`, children referenced as
`(handle M)`. A handle is that text: a stable string that names the term's e-class in any
later egglog text (rules, checks, unions) and across unions. A `handle` function is used
rather than one `let` global per term because each global is a table of its own and
loading slows quadratically with them (20k terms: 3.9 s with lets and growing, 0.8 s with
the function; egglog 13.2).

Shapes: Python has already shaped every added Program (`infer_shapes`). The driver seeds
those shapes into egglog for one term in `seed_every` along each path (default 16) and lets
the `shapes` rules derive the rest, so saturation takes ~2*seed_every iterations instead of
two per level of depth (a 20k-deep chain: 0.2 s instead of 6 s), and every seeded term
cross-checks the egglog rules against Python: a disagreement is a shape conflict. From
then on egglog's shapes are the only ones: serialize() exports them per e-class with the
JSON (apsat.egraph.serialize) and extraction reads them there, rather than shaping the
e-classes again in Python.
"""
from __future__ import annotations

import re
import time

from egglog import bindings

from apsat.egraph import bursts, diagnose, egglog_io
from apsat.egraph import serialize as _serialize
from apsat.egraph.serialize import SORT_OF, raw_id
from apsat.lang.program import Program
from apsat.lang.syntax import VAR, egg_node, parse_term
from apsat.lang.term import Term, postorder
from apsat.errors import EGraphError, ShapeError
from apsat.egraph.facts import tensor_facts
from apsat.lang.dtypes import TypeMismatch
from apsat.targets import parse_target

__all__ = ["EGraph", "LANGUAGE", "SORT_OF", "egg_term"]

LANGUAGE = egglog_io.language_text()
# Statements per egglog call when loading terms: one statement a call pays egglog's fixed
# overhead each time, one big call parses in quadratic time; 4 to 32 measure alike.
STATEMENT_BATCH = 16
_HANDLE = re.compile(r"\(handle (\d+)\)")
_SPAN = bindings.PanicSpan()


def egg_term(term: Term) -> str:
    """egglog text of a whole term in tree form (a shared sub-term is written at each
    use; pattern variables as `?name`), as this e-graph's language spells it (syntax.egg_node
    already spells renamed constructors egglog's way). For rule tests and small facts;
    add() loads programs node by node instead."""
    text: dict[Term, str] = {}
    for t in postorder(term):
        text[t] = "?" + t.args[0] if t.op == VAR else egg_node(t, text.__getitem__)
    return text[term]


def _bindings_egraph():
    """A bindings EGraph with egglog 14's tree-decomposed query plans turned off: with them
    the layout/transpose-compose-N rules take seconds an iteration on light ResNet-50 (its
    layout phase: 0.7 s -> over its 10 s limit; egglog issues #872, #960). egglog 13.2 has
    no such planner and no `no_decomp` argument."""
    try:
        return bindings.EGraph(no_decomp=True)
    except TypeError:
        return bindings.EGraph()


class EGraph:
    """An e-graph over the access-pattern language with its shape analysis loaded.

    Not thread-safe (egglog's EGraph is unsendable): create and use it in one thread."""

    def __init__(self, target: str = "gpu", seed_every: int = 16):
        """Load the language (language.egg, shape_rules.egg). `target` is stored for the
        rules and cost models that read it; `seed_every` is how often Python's shapes are
        seeded along a path (0: never, egglog derives every shape; 1: every term)."""
        self.target = parse_target(target)
        self.seed_every = seed_every
        self._g = _bindings_egraph()
        self._rulesets: set[str] = set()
        self._rule_sizes: dict[str, list[int]] = {}  # ruleset -> per rule, Expr nodes one match can add
        self._combined: dict[str, list[str]] = {}    # combined ruleset -> its parts
        self._ids: dict[Term, int] = {}          # added term -> handle number
        self._next = 0                           # handle numbers are never reused
        self.tensor_shapes: dict[str, tuple[int, ...]] = {}   # every tensor added: name -> dims
        self.tensor_types: dict[str, str] = {}  # every float tensor added: name -> element type
        self.opaque_nodes: dict = {}            # opaque calls of added programs, by call name
        self.weights: frozenset = frozenset()   # tensors known at load time (Program.weights)
        self.outputs: dict[str, str] = {}       # output name -> handle, latest add wins
        self._saved: list[dict] = []            # push()'s saved states, innermost last
        self.load_text(LANGUAGE, what="loading the language (language.egg, shape_rules.egg)")
        if self.target.facts():
            self.load_text(self.target.facts(), what=f"setting facts for target {self.target.name}")

    # ---- egglog access ---------------------------------------------------------------

    def _run(self, text: str, what: str) -> list:
        return egglog_io.run_text(self._g, text, what)

    def _holds(self, query: str, what: str) -> bool:
        """True iff `(check query)` succeeds; a failed check is False, not an error."""
        with egglog_io.captured_stderr():
            try:
                self._g.run_program(*self._g.parse_program(f"(check {query})"))
                return True
            except BaseException as exc:  # noqa: BLE001 - PanicException is a BaseException
                if not egglog_io.is_egglog_failure(exc):
                    raise
                if "Check failed" in str(exc):
                    return False
                raise egglog_io.egglog_error(exc, what) from None

    def _value(self, handle: str):
        """The egglog Value of the handle's e-class (canonical, so unions are seen)."""
        number = self._handle_number(handle)
        with egglog_io.egglog_call(f"looking up {handle}"):
            return self._g.eval_expr(bindings.Call(_SPAN, "handle", [bindings.Lit(_SPAN, bindings.Int(number))]))[1]

    def _handle_number(self, handle: str) -> int:
        m = _HANDLE.fullmatch(handle) if isinstance(handle, str) else None
        if m is None or int(m.group(1)) >= self._next:
            raise EGraphError(f"unknown handle {handle!r}: handles are the strings add() returns")
        return int(m.group(1))

    # ---- loading -----------------------------------------------------------------------

    def load_text(self, text: str, what: str = "loading egglog text") -> None:
        """Run egglog text (declarations, rules, facts, unions) on this e-graph.

        Contract: rulesets it declares become valid names for run(); afterwards the
        shapes ruleset is saturated and checked, so a union of differently-shaped terms
        raises ShapeError here. egglog failures raise EGraphError; nothing is validated
        (the rule-file loader does that)."""
        with egglog_io.egglog_call(what):
            commands = self._g.parse_program(text)
            self._g.run_program(*commands)
        names = [c.name for c in commands
                 if isinstance(c, (bindings.AddRuleset, bindings.UnstableCombinedRuleset))]
        self._rulesets.update(names)
        bursts.record_rule_sizes(commands, self._rule_sizes, self._combined)
        if "shapes" in self._rulesets:
            self._saturate_shapes()

    def add(self, program, shapes: dict | None = None) -> str:
        """Add a single-output Program (or a Term with `shapes`, tensor name -> dims) and
        return the handle of its output e-class.

        Contract: the program is shape-checked in Python first (ShapeError, nothing
        added); a tensor already added with other dims raises ShapeError; terms added
        before keep their handles (hash-consing); the shapes ruleset is saturated and
        checked before returning. A multi-output Program raises ValueError: use
        add_outputs."""
        program = self._as_program(program, shapes)
        if len(program.outputs) != 1:
            raise ValueError(f"program has {len(program.outputs)} outputs; use add_outputs()")
        return next(iter(self.add_outputs(program).values()))

    def add_outputs(self, program, shapes: dict | None = None) -> dict[str, str]:
        """Add a Program with any number of outputs; return output name -> handle (also
        recorded in `self.outputs`, which serialize() uses as root e-classes). The
        program's tensor shapes, opaque nodes and weight names are kept in
        `self.tensor_shapes`, `self.opaque_nodes` and `self.weights` (what extraction
        needs to rebuild a Program and to price weight-only work)."""
        program = self._as_program(program, shapes)
        statements = tensor_facts(self, program)
        new_tensors = [n for n in program.tensor_shapes if n not in self.tensor_shapes]
        height: dict[Term, int] = {}   # longest path down to a seeded (or leaf) term
        new_terms = []
        for term in program.terms():
            kids = list(term.children())
            h = 1 + max((height.get(c, 0) for c in kids), default=0)
            if term in self._ids:
                height[term] = 0
                continue
            number, self._next = self._next, self._next + 1
            self._ids[term] = number
            new_terms.append(term)
            ref = f"(handle {number})"
            text = f"(set {ref} {egg_node(term, self.handle_of)})"
            if self.seed_every and kids and h >= self.seed_every:
                it, item = program.shape_of(term)
                dims = it + item
                text += f" (shape-rank {ref} {len(dims)} {len(it)})"
                text += "".join(f" (shape-dim {ref} {i} {d})" for i, d in enumerate(dims))
                h = 0
            height[term] = h
            statements.append(text)
        try:
            with egglog_io.captured_stderr():
                for start in range(0, len(statements), STATEMENT_BATCH):
                    self._run("\n".join(statements[start:start + STATEMENT_BATCH]), "adding a program")
        except EGraphError:
            for term in new_terms:   # their numbers stay used: egglog may hold some of them
                del self._ids[term]
            raise
        self.tensor_shapes.update((n, program.tensor_shapes[n]) for n in new_tensors)
        self.tensor_types.update((n, program.tensor_types[n]) for n in new_tensors if n in program.tensor_types)
        self.opaque_nodes.update(program.opaque_nodes)
        self.weights |= program.weights
        self._saturate_shapes()
        handles = {name: self.handle_of(t) for name, t in program.outputs.items()}
        self.outputs.update(handles)
        return handles

    def add_statements(self, build) -> None:
        """Low-level loading for template instantiation (apsat.rules.regions): `build`
        is called with `fresh()` (returns a new handle string) and returns egglog
        statements (`(set HANDLE NODE)`, `(union HANDLE NODE)`) over existing handles.
        Runs them in small batches, then saturates and checks shapes."""
        def fresh() -> str:
            number, self._next = self._next, self._next + 1
            return f"(handle {number})"

        statements = build(fresh)
        with egglog_io.captured_stderr():
            for start in range(0, len(statements), STATEMENT_BATCH):
                self._run("\n".join(statements[start:start + STATEMENT_BATCH]), "instantiating a region")
        self._saturate_shapes()

    @staticmethod
    def _as_program(program, shapes) -> Program:
        if isinstance(program, Program):
            return program
        if isinstance(program, Term):
            return Program({"out": program}, dict(shapes or {}))
        raise TypeError(f"add() takes a Program or a Term, not {type(program).__name__}")

    def handle_of(self, term: Term) -> str:
        """The handle of a term added earlier (any sub-term of an added program)."""
        if term not in self._ids:
            raise EGraphError(f"term was never added: {term!r}")
        return f"(handle {self._ids[term]})"

    # ---- running -------------------------------------------------------------------------

    @property
    def rulesets(self) -> list[str]:
        """Names run() accepts: `shapes` and every ruleset loaded since."""
        return sorted(self._rulesets)

    def run(self, rulesets, iter_limit: int = 30, node_limit: int = 100_000,
            time_limit: float = 10.0, match_limit: int = 100_000, ban_length: int = 2,
            memory_limit: float | None = None) -> dict:
        """Run the named rulesets (a name or a list) until saturation or a limit, in
        bursts; `memory_limit` is MiB of the process's resident memory (None: no limit).
        The contract and the report's keys are in apsat.egraph.bursts.run."""
        return bursts.run(self, rulesets, iter_limit, node_limit, time_limit, match_limit, ban_length,
                          memory_limit)

    def growth_per_match(self, rulesets) -> int:
        """The most Expr nodes one match of every rule of `rulesets` can add together
        (apsat.egraph.bursts.growth_per_match)."""
        return bursts.growth_per_match(rulesets, self._rule_sizes, self._combined)

    def push(self) -> None:
        """Save this e-graph's whole state (egglog's and this object's); pop() returns to
        it. Pushes nest. Handles returned after a push name nothing once it is popped.
        For many short-lived programs over one loaded language (a fresh EGraph costs
        ~0.1 s of loading, a push and pop ~2 ms)."""
        self._run("(push)", "saving the e-graph")
        kept = {k: v for k, v in vars(self).items() if k not in ("_g", "_saved")}
        self._saved.append({k: v.copy() if isinstance(v, (dict, set, list)) else v for k, v in kept.items()})

    def pop(self) -> None:
        """Return to the state of the matching push(); EGraphError with no push open."""
        if not self._saved:
            raise EGraphError("pop() without a push()")
        self._run("(pop)", "restoring the e-graph")
        state = self._saved.pop()
        for k in [k for k in vars(self) if k not in ("_g", "_saved") and k not in state]:
            delattr(self, k)
        vars(self).update(state)

    def _saturate_shapes(self, time_limit: float = 120.0) -> None:
        """Run `shapes` to a fixpoint in bursts of 64 iterations (idle ones cost ~40 us),
        then check. Why not `(saturate ...)`: a rule file that adds a looping rule to
        `shapes` would hang the process; here it becomes an EGraphError."""
        start = time.perf_counter()
        while True:
            out = self._run("(run-schedule (repeat 64 (run shapes)))", "saturating shapes")
            if not out[0].report.updated:
                break
            if time.perf_counter() - start > time_limit:
                raise EGraphError(f"shape analysis still changing after {time_limit:.0f} s; "
                                  "a rule in ruleset `shapes` may loop")
        self._check_shapes()

    def _check_shapes(self) -> None:
        """Raise ShapeError when egglog flagged an ill-shaped node or a shape conflict."""
        if self._holds("(shape-invalid ?e ?why)", "checking shapes"):
            raise ShapeError(diagnose.describe(self._g, "shape-invalid"))
        if self._holds("(shape-conflict ?e)", "checking shapes"):
            raise ShapeError(diagnose.describe(self._g, "shape-conflict"))
        if self._holds("(type-conflict ?e)", "checking types"):
            raise TypeMismatch(diagnose.describe(self._g, "type-conflict"))

    # ---- reading ---------------------------------------------------------------------------

    def class_of(self, handle: str) -> str:
        """The serialized e-class id (`Expr-N`, as in serialize()) a handle now names;
        two handles of unioned terms give the same id."""
        return f"Expr-{raw_id(self._value(handle))}"

    def shape_of(self, handle: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """((iterated dims), (item dims)) of the handle's e-class, read from egglog's
        ndim/split/dim functions. ShapeError if egglog derived no shape for it."""
        value = self._value(handle)
        lookup = self._g.lookup_function
        with egglog_io.captured_stderr():
            n, s = lookup("ndim", [value]), lookup("split", [value])
            if n is None or s is None:
                raise ShapeError(f"no shape derived for e-class {self.class_of(handle)} ({handle})")
            n, s = self._g.value_to_i64(n), self._g.value_to_i64(s)
            dims = []
            for i in range(n):
                key = self._g.eval_expr(bindings.Lit(_SPAN, bindings.Int(i)))[1]
                d = lookup("dim", [value, key])
                if d is None:
                    raise ShapeError(f"no dim {i} derived for e-class {self.class_of(handle)} ({handle})")
                dims.append(self._g.value_to_i64(d))
        return tuple(dims[:s]), tuple(dims[s:])

    def matches(self, pattern: str, handle: str) -> bool:
        """True iff the pattern's top node is a member of the handle's e-class.

        `pattern` is surface syntax with `?name` variables where sub-terms go (a variable
        used twice must bind one e-class). ParseError for bad patterns, EGraphError for a
        bad handle; a pattern that does not match is False, never an error."""
        term = parse_term(pattern, allow_vars=True)
        ref = f"(handle {self._handle_number(handle)})"
        if term.op == VAR:
            return True
        return self._holds(f"(= {ref} {egg_term(term)})", f"matching {pattern}")

    def sites(self, probes) -> list[list[str] | None]:
        """The Expr e-classes where each probe matches now; the e-graph is left as it was.

        A probe is (query, site): egglog query facts, and an Expr expression over their
        variables naming the class to report (a rule's left side bound as `(= ?s LHS)`
        and `?s`). Each probe runs as one rule for one iteration on a pushed copy, popped
        after reading. Returns per probe its site class ids (as class_of gives them,
        sorted), or None when egglog refused the probe (a type error, say). A site that
        names a term not in the e-graph yields a class that serialize() will not list."""
        out: list = [None] * len(probes)
        self._run("(push)", "probing rule sites")
        try:
            self._run("(relation apsat-site (i64 Expr))\n(ruleset apsat-sites)", "probing rule sites")
            for i, (query, site) in enumerate(probes):
                try:
                    self._run(f"(rule ({query}) ((apsat-site {i} {site})) :ruleset apsat-sites)", "probing rule sites")
                    out[i] = set()
                except EGraphError:
                    continue      # this probe stays None
            self._run("(run apsat-sites 1)", "probing rule sites")
            with egglog_io.egglog_call("reading rule sites"):
                rows = self._g.freeze().functions["apsat-site"].rows
            for row in rows:
                out[self._g.value_to_i64(row.inputs[0])].add(f"Expr-{raw_id(row.inputs[1])}")
        finally:
            self._run("(pop)", "probing rule sites")
        return [None if s is None else sorted(s) for s in out]

    def _node_count(self) -> int:
        out = self._run("(print-size)", "counting nodes")
        return sum(n for name, n in out[0].sizes if SORT_OF.get(name) == "Expr")

    def size(self) -> tuple[int, int]:
        """(Expr e-nodes, Expr e-classes) now in the e-graph."""
        nodes, classes = 0, set()
        for op, fn in self._g.freeze().functions.items():
            if SORT_OF.get(op) == "Expr":
                nodes += len(fn.rows)
                classes.update(r.output for r in fn.rows)
        return nodes, len(classes)

    def serialize(self) -> dict:
        """The e-graph as extraction-gym JSON, parsed: {"nodes": {id: {"op", "children"
        (node ids), "eclass", "cost", "subsumed"}}, "class_data": {eclass: {"type",
        "shape"}}, "root_eclasses": [...]}.

        Contract: only the language's constructors and their literals are nodes (shape
        tables and handles are left out); ops carry registry names; e-class ids agree
        with class_of(); a child is named by one node of its e-class (the first listed);
        root_eclasses are the classes of `self.outputs`. Every Expr class carries its
        access shape as egglog derived it, `"shape": [[iterated dims], [item dims]]`
        (shape_of's figures): the one source of shapes for extraction and decoding.
        Built from egglog's frozen tables (apsat.egraph.serialize)."""
        roots = list(dict.fromkeys(self.class_of(h) for h in self.outputs.values()))
        with egglog_io.egglog_call("serializing the e-graph"):
            return _serialize.serialize(self._g, roots)

    def __repr__(self) -> str:
        nodes, classes = self.size()
        return f"<EGraph target={self.target!r} nodes={nodes} classes={classes} outputs={list(self.outputs)}>"
