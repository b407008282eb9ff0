"""Rule files: validate declarative egglog rule files and assemble them into rulesets.

A rule file holds only declarations and rules: `(ruleset NAME)`, `rewrite`, `birewrite`,
`rule`, `pattern` (the short form, expanded into a `rule` first: apsat/rules/sugar.py), and
helper `relation`/`function` declarations. Anything that runs, extracts or
touches files (`run`, `let`, `extract`, `include`, `input`, `output`, ...) is refused, as
are unknown ops, wrong arities, variables on a right-hand side that the left side does not
bind, rules outside a named ruleset, and a ruleset or rule name defined twice. Every
refusal is a RuleError `path:line: reason`, raised before any text reaches egglog.

Each rule has a name: its `:name "..."` or, failing that, `FILE-STEM:LINE`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from apsat.egraph.egglog_io import language_text
from apsat.errors import RuleError
from apsat.rules.commute import MAX_SWAPPED, commutative_pairs, variants
from apsat.rules.plans import ON_REQUEST, PHASE_NAMES
from apsat.rules.sexpr import Atom, Form, SexprError, atoms, calls, read_forms
from apsat.rules.sugar import expand_patterns

BUILTIN_DIR = Path(__file__).resolve().parent
RULE_FORMS = {"rewrite", "birewrite", "rule"}
DECLARATIONS = {"ruleset", "relation", "function"}
# egglog primitives and action keywords a rule may use (no arity check)
PRIMITIVES = set("+ - * / % << >> & | ^ < > <= >= = != min max not and or abs log2 "
                 "to-f64 to-i64 neg sqrt-f64 bool-= bool-< bool-> replace count-matches "
                 "union set let delete subsume".split())
REFUSED_ACTIONS = {"panic", "extract", "print-function", "input", "output", "include"}
# Limits, checked before egglog sees a file (the built-in files: 5-20 KB, at most 26 rules,
# nesting 16 deep). Past them egglog overflows its stack or takes gigabytes.
MAX_FILE_BYTES, MAX_FORMS, MAX_NESTING = 1 << 20, 500, 100
_INT = re.compile(r"[-+]?\d+")
_IDENT = re.compile(r"[A-Za-z_?][\w\-?!*+/<>=.]*")


@dataclass
class Rule:
    """One rule: its `name`, `ruleset`, source `path` and `line`, and egglog `text`."""

    name: str
    ruleset: str
    path: Path
    line: int
    text: str

    def text_in(self, ruleset: str) -> str:
        """This rule's text moved into another ruleset (to run one rule alone)."""
        return re.sub(r":ruleset\s+[^\s()]+", f":ruleset {ruleset}", self.text)   # its operand-order variants too


@dataclass
class RuleFile:
    """A validated rule file: rulesets it declares, helper declarations, rules."""

    path: Path
    rulesets: list[tuple[str, int]] = field(default_factory=list)   # (name, line)
    declarations: list[str] = field(default_factory=list)          # helper function/relation text
    rules: list[Rule] = field(default_factory=list)
    phases: dict[str, str] = field(default_factory=dict)           # ruleset -> the phase it joins


@lru_cache(maxsize=1)
def language_signatures() -> dict[str, int | None]:
    """Name -> arity of every constructor, function and relation the language's egglog
    files (language.egg, shape_rules.egg) declare."""
    sig: dict[str, int | None] = {}
    for form in read_forms(language_text()):
        if not isinstance(form, Form):
            continue
        if form.head in ("datatype", "datatype*"):
            groups = form.items[2:] if form.head == "datatype" else [
                g for sort in form.items[1:] if isinstance(sort, Form) for g in sort.items[1:]]
            for ctor in groups:
                if isinstance(ctor, Form):
                    sig[ctor.head] = len(ctor.items) - 1
        elif form.head in ("function", "relation", "constructor") and len(form.items) > 2:
            args = form.items[2]
            sig[form.items[1].text] = len(args.items) if isinstance(args, Form) else None
        elif form.head == "ruleset":
            pass
    return sig


def is_variable(atom: Atom) -> bool:
    """A pattern variable: an identifier that is not a keyword or a bool."""
    t = atom.text
    return bool(_IDENT.fullmatch(t)) and t not in ("true", "false") and not t.startswith(":")


def _keyword(items: list, key: str):
    """The item after keyword `key` in a form's items (None when absent)."""
    for i, it in enumerate(items):
        if isinstance(it, Atom) and it.text == key:
            return items[i + 1] if i + 1 < len(items) else None
    return None


def positional(items: list) -> list:
    """A form's items before its first `:keyword` (`:when`, `:ruleset`, ...)."""
    out = []
    for it in items:
        if isinstance(it, Atom) and it.text.startswith(":"):
            break
        out.append(it)
    return out


def bound_variables(node) -> set[str]:
    """Variables a pattern binds: identifiers that are not in head position."""
    heads = {id(f.items[0]) for f in calls(node) if f.items}
    return {a.text for a in atoms(node) if id(a) not in heads and is_variable(a)}


class _Checker:
    """Validates forms of one file against the known signatures."""

    def __init__(self, path: Path, signatures: dict, rulesets: set[str]):
        self.path, self.sig, self.rulesets = path, signatures, rulesets

    def fail(self, line: int, reason: str):
        raise RuleError(f"{self.path}:{line}: {reason}")

    def check_calls(self, node, where: str):
        for f in calls(node):
            if not f.items:
                continue
            head = f.items[0]
            if isinstance(head, Form):
                continue  # a query/action list: its elements are checked as calls
            name = head.text
            if name in REFUSED_ACTIONS:
                self.fail(f.line, f"`{name}` is not allowed in a rule file (rule files are declarative)")
            if name.startswith("$"):
                self.fail(f.line, f"global {name} is not allowed in a rule file")
            if name in PRIMITIVES:
                continue
            if name not in self.sig:
                self.fail(f.line, f"unknown op '{name}' in {where}")
            arity = self.sig[name]
            if arity is not None and len(f.items) - 1 != arity:
                self.fail(f.line, f"'{name}' takes {arity} arguments, got {len(f.items) - 1}")

    def check_ruleset(self, form: Form) -> str:
        rs = _keyword(form.items, ":ruleset")
        if rs is None:
            self.fail(form.line, "rule has no :ruleset (rules must belong to a named ruleset)")
        if rs.text not in self.rulesets:
            self.fail(form.line, f"unknown ruleset '{rs.text}' (declare it with (ruleset {rs.text}))")
        return rs.text

    def rewrite(self, form: Form) -> None:
        pos = positional(form.items[1:])
        if len(pos) != 2:
            self.fail(form.line, f"{form.head} needs a left and a right side, got {len(pos)} parts")
        lhs, rhs = pos
        if not isinstance(lhs, Form):
            self.fail(form.line, "the left side must be a pattern, not a bare variable "
                      "(egglog cannot match one: anchor the rule on a construct)")
        when = _keyword(form.items, ":when")
        self.check_calls(lhs, "the left side")
        self.check_calls(rhs, "the right side")
        bound = bound_variables(lhs) | (bound_variables(when) if when is not None else set())
        if when is not None:
            self.check_calls(when, ":when")
        self.unbound(rhs, bound, "right side")
        if form.head == "birewrite":
            self.unbound(lhs, bound_variables(rhs) | (bound_variables(when) if when is not None else set()), "left side")

    def rule(self, form: Form) -> None:
        pos = positional(form.items[1:])
        if len(pos) != 2 or not all(isinstance(p, Form) for p in pos):
            self.fail(form.line, "rule needs a query list and an action list")
        query, actions = pos
        self.check_calls(query, "the query")
        self.check_calls(actions, "the actions")
        bound = bound_variables(query)
        for action in actions.items:
            if isinstance(action, Form) and action.head == "let" and len(action.items) == 3:
                self.unbound(action.items[2], bound, "action")
                bound.add(action.items[1].text)
            else:
                self.unbound(action, bound, "action")

    def unbound(self, node, bound: set[str], where: str) -> None:
        heads = {id(f.items[0]) for f in calls(node) if isinstance(f, Form) and f.items}
        for a in atoms(node):
            if id(a) not in heads and is_variable(a) and a.text not in bound:
                self.fail(a.line, f"variable '{a.text}' on the {where} is not bound by the left side")


def _check_limits(path: Path, forms: list) -> None:
    """RuleError past MAX_FORMS top-level forms or MAX_NESTING levels of parentheses, and
    for an integer literal outside egglog's i64."""
    if len(forms) > MAX_FORMS:
        raise RuleError(f"{path}:{forms[MAX_FORMS].line}: more than {MAX_FORMS} rules and "
                        f"declarations in one file (the limit)")
    for form in (f for f in forms if isinstance(f, Form)):    # atoms: the caller refuses them
        stack = [(form, 1)]
        while stack:
            node, depth = stack.pop()
            if depth > MAX_NESTING:
                raise RuleError(f"{path}:{node.line}: forms nest more than {MAX_NESTING} deep (the limit)")
            stack.extend((it, depth + 1) for it in node.items if isinstance(it, Form))
            for it in node.items:
                if isinstance(it, Atom) and _INT.fullmatch(it.text) and not -2 ** 63 <= int(it.text) < 2 ** 63:
                    raise RuleError(f"{path}:{it.line}: integer {it.text} does not fit in i64")


def _ruleset_declaration(check: _Checker, form: Form, rulesets: set[str], signatures: dict) -> tuple[str, str | None]:
    """(name, phase or None) of `(ruleset NAME)` or `(ruleset NAME :phase PHASE)`, checked:
    a name defined twice or named like an operator, and a phase no plan has, are refused."""
    items = form.items
    name = items[1].text if len(items) in (2, 4) and isinstance(items[1], Atom) else None
    phase = None
    if len(items) == 4 and isinstance(items[2], Atom) and items[2].text == ":phase" and isinstance(items[3], Atom):
        phase = items[3].text
    if name is None or (len(items) == 4 and phase is None):
        check.fail(form.line, "expected (ruleset NAME) or (ruleset NAME :phase PHASE)")
    if name in rulesets or name == "shapes":
        check.fail(form.line, f"ruleset '{name}' is defined twice")
    if name in signatures:     # egglog would refuse it later ("Shadowing is not allowed")
        check.fail(form.line, f"ruleset '{name}' is named like the language's operator, "
                   "function or relation of that name: choose another name")
    if phase is not None and phase not in PHASE_NAMES + (ON_REQUEST,):
        check.fail(form.line, f"unknown phase '{phase}' (the plans' phases: {', '.join(PHASE_NAMES)}; "
                   f"or {ON_REQUEST}: run only when named)")
    return name, phase


def parse_rule_file(path, known_rulesets: set[str], signatures: dict) -> RuleFile:
    """Validate one rule file. `known_rulesets`: rulesets defined by files loaded before
    (a file may add rules to them but not declare them again). `signatures` is updated
    with the file's helper declarations."""
    path = Path(path)
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise RuleError(f"{path}:1: rule file of {path.stat().st_size} bytes, over the limit of "
                            f"{MAX_FILE_BYTES} (1 MiB)")
        text = path.read_text(encoding="utf-8-sig")      # a byte-order mark is not text
    except (OSError, UnicodeDecodeError) as exc:
        raise RuleError(f"{path}:1: cannot read rule file ({exc.__class__.__name__})") from None
    try:
        forms = read_forms(text)
    except SexprError as exc:
        raise RuleError(f"{path}:{exc.line}: syntax error: {exc.reason}") from None
    text, forms = expand_patterns(path, text, forms)     # each (pattern ..) a (rule ..), on its lines
    _check_limits(path, forms)
    out = RuleFile(path)
    rulesets = set(known_rulesets)
    check = _Checker(path, signatures, rulesets)
    for form in forms:
        if isinstance(form, Atom):
            check.fail(form.line, f"unexpected '{form.text}' at top level")
        if form.head in REFUSED_ACTIONS or form.head not in RULE_FORMS | DECLARATIONS:
            check.fail(form.line, f"`{form.head or '('}` is not allowed in a rule file: only ruleset, "
                       "rewrite, birewrite, rule, pattern, relation and function declarations")
        if form.head == "ruleset":
            name, phase = _ruleset_declaration(check, form, rulesets, signatures)
            rulesets.add(name)
            out.rulesets.append((name, form.line))
            if phase is not None:
                out.phases[name] = phase
        elif form.head in ("function", "relation"):
            if len(form.items) < 3 or not isinstance(form.items[1], Atom) or not isinstance(form.items[2], Form):
                check.fail(form.line, f"expected ({form.head} NAME (ARG-SORTS ...) ...)")
            name = form.items[1].text
            if name in signatures:
                check.fail(form.line, f"'{name}' is already declared (prefix helpers with the family name)")
            signatures[name] = len(form.items[2].items)
            out.declarations.append(text[form.start:form.end])
        else:
            check.rewrite(form) if form.head in ("rewrite", "birewrite") else check.rule(form)
            ruleset = check.check_ruleset(form)
            name_atom = _keyword(form.items, ":name")
            name = name_atom.text.strip('"') if name_atom is not None else f"{path.stem}:{form.line}"
            body = text[form.start:form.end]
            if name_atom is None:
                body = body[:-1] + f' :name "{name}")'
            pairs = commutative_pairs(positional(form.items[1:])[0])   # a rewrite's left side, a rule's query
            if len(pairs) > MAX_SWAPPED:
                check.fail(form.line, f"the pattern has more than {MAX_SWAPPED} commutative pairs "
                           f"(each matches both operand orders: 2^{MAX_SWAPPED} variants at most)")
            body = "\n".join([body] + variants(form, pairs, name))
            out.rules.append(Rule(name, ruleset, path, form.line, body))
    return out
