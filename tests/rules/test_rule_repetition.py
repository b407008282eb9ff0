"""No family unrolled by copy in the built-in egglog files.

Every `rule`, `rewrite` and `birewrite` of apsat/rules/*.egg and apsat/lang/*.egg, as
written (text generated from the op registry into them is one rule per operator by
construction), is read with the rule files' s-expression reader and compared with every other: two rules that are
the same up to one constructor name (every other token equal once `:name` is dropped and
variables are renamed in order of appearance; a string may differ only by that name) are one
rule written out per constructor, which belongs in a relation over the constructors and one
rule querying it (as `(activation op)` does for fusion's activation variants). Pairs found
fail the test, listed `file:line ~ file:line (name / name)`.

Not counted: a rule whose query is one bare constructor `(= o (C args..))` and whose actions
only assert relation facts about `o`. Such rules are the rows of a classification relation
(`unary-map`, `item-keep`, `activation`, ...: one per operator, by design, and the op
registry may generate them), not copies of code. The pairs in ALLOWED are known and
deliberate; each says why.
"""
from __future__ import annotations

import itertools
import re
from pathlib import Path

from apsat.egraph.egglog_io import language_text
from apsat.rules.sexpr import Atom, Form, read_forms

ROOT = Path(__file__).resolve().parents[2] / "apsat"
EGG_FILES = sorted((ROOT / "rules").glob("*.egg")) + sorted((ROOT / "lang").glob("*.egg"))
RULE_HEADS = {"rule", "rewrite", "birewrite"}
_IDENT = re.compile(r"[A-Za-z_?][\w\-?!*+/<>=.]*")

# (file, constructor, constructor) -> (pairs of rules the same up to those two names, why
# they stay). A new copy between the same two constructors fails the test as well.
ALLOWED = {
    ("attention-fusion.egg", "elementwise-div", "elementwise-mul"): (1,
        "aux-scores-scaled and -divided: the scale after the product, times or over a scalar; a "
        "relation over the two operators would need a rule per operator to assert it (a rule file "
        "holds no facts): no fewer rules"),
    ("algebra.egg", "access", "access-reshape"): (1,
        "reshape-reshape and reshape-access: a reshape ignores how its argument was re-split or "
        "reshaped; the inner constructors' second arguments are of different sorts (AccessShape, "
        "i64), so a relation over them needs one rule per constructor to assert: no fewer rules"),
    ("fusion.egg", "elementwise-add", "elementwise-mul"): (1,
        "scale-merge and shift-merge merge two per-channel vectors under one operator; folding "
        "them needs an 'associative operator' relation the language does not have (item-nary o 0 "
        "is exactly add and mul today, but says variadic, not associative), for two rules"),
    ("shape_rules.egg", "access", "access-squeeze"): (1,
        "the one-line negative-axis check of ops with an axis argument (a helper relation would "
        "cost a rule per op to save one)"),
    ("shape_rules.egg", "access", "access-insert-axis"): (1, "as access / access-squeeze"),
    ("shape_rules.egg", "access-insert-axis", "access-squeeze"): (2,
        "the negative-axis check, and 'dims before the axis stay': one line each"),
    ("shape_rules.egg", "access-cartesian-product", "access-pair"): (1,
        "both keep their first operand's iterated dims: one line each"),
    ("shape_rules.egg", "access-concatenate", "access-gather"): (2,
        "the negative-axis and past-the-last-dim checks of the two ops with an (Expr Expr i64) "
        "signature; a helper relation over them would cost a rule per op to save one each"),
    ("shape_rules.egg", "access-broadcast", "access-reshape"): (3,
        "both take their result shape from their access-shape argument, so their rank and dim "
        "rules read the same; a helper relation over the two would add two rules to save three"),
}
# precision.egg moves a widening cast out of each view: one rule per view constructor of two
# arguments (access, transpose, reshape, squeeze, insert-axis, broadcast), each pair of them the
# same up to the name. Constructors are not values in egglog, and their second arguments are of
# three sorts (i64, IntList, AccessShape), so a relation over them needs a rule per
# constructor to assert (as algebra's access / access-reshape): no fewer rules. Each keeps its
# own name, which tests/rules/test_precision.py checks one by one.
_PRECISION_VIEWS = ("access", "access-broadcast", "access-insert-axis", "access-reshape", "access-squeeze",
                    "access-transpose")
ALLOWED.update({("precision.egg", a, b): (1, "a widening moved out of one view per rule (above)")
                for a, b in itertools.combinations(_PRECISION_VIEWS, 2)})


def _constructors(forms) -> set[str]:
    """Names declared by `datatype` / `datatype*` forms (the language's constructors)."""
    out = set()
    for form in forms:
        if not isinstance(form, Form) or form.head not in ("datatype", "datatype*"):
            continue
        groups = form.items[2:] if form.head == "datatype" else [
            g for sort in form.items[1:] if isinstance(sort, Form) for g in sort.items[1:]]
        out.update(c.head for c in groups if isinstance(c, Form) and c.head)
    return out


def _strip_name(items: list) -> list:
    """The items without a `:name "..."` pair."""
    out, skip = [], False
    for it in items:
        if skip:
            skip = False
        elif isinstance(it, Atom) and it.text == ":name":
            skip = True
        else:
            out.append(it)
    return out


def _tokens(form: Form) -> list[tuple[str, str]]:
    """The rule as a flat token list of (kind, text): kind is "(" / ")", "head" (a name in
    head position), "var" (renamed v0, v1.. by first appearance), "str" or "lit"."""
    names: dict[str, str] = {}
    out: list[tuple[str, str]] = []

    def walk(node, head: bool, keyword_value: bool = False):
        if isinstance(node, Form):
            out.append(("(", "("))
            items = _strip_name(node.items) if node is form else node.items
            for i, it in enumerate(items):
                after_key = i > 0 and isinstance(items[i - 1], Atom) and items[i - 1].text.startswith(":")
                walk(it, i == 0, after_key and node is form)
            out.append((")", ")"))
            return
        t = node.text
        if keyword_value:             # `:ruleset NAME`: rules of two rulesets cannot be one rule
            out.append(("lit", t))
        elif head:
            out.append(("head", t))
        elif t.startswith('"'):
            out.append(("str", t))
        elif _IDENT.fullmatch(t) and t not in ("true", "false") and not t.startswith(":"):
            out.append(("var", names.setdefault(t, f"v{len(names)}")))
        else:
            out.append(("lit", t))
    walk(form, False)
    return out


def _is_classification_fact(form: Form) -> bool:
    """True for `(rule ((= o (C vars..))) ((rel o ..) ..) ..)`: a row of relation facts
    about one operator, not code."""
    if form.head != "rule" or len(form.items) < 3:
        return False
    query, actions = form.items[1], form.items[2]
    if not (isinstance(query, Form) and len(query.items) == 1):
        return False
    q = query.items[0]
    if not (isinstance(q, Form) and q.head == "=" and len(q.items) == 3 and isinstance(q.items[1], Atom)
            and isinstance(q.items[2], Form) and all(isinstance(a, Atom) for a in q.items[2].items)):
        return False
    return isinstance(actions, Form) and all(
        isinstance(a, Form) and a.head not in ("union", "set", "let", "delete", "subsume")
        and all(isinstance(x, Atom) for x in a.items) for a in actions.items)


def _name(form: Form) -> str:
    for i, it in enumerate(form.items[:-1]):
        if isinstance(it, Atom) and it.text == ":name":
            return form.items[i + 1].text.strip('"')
    return "-"


def _one_name_apart(a: list, b: list, constructors: set[str]) -> tuple[str, str] | None:
    """(x, y) when token lists a and b differ only by constructor x in a being y in b (in
    head positions, and inside strings); None otherwise."""
    if len(a) != len(b):
        return None
    pair = None
    for (ka, ta), (kb, tb) in zip(a, b):
        if ka != kb:
            return None
        if ta == tb or ka != "head":
            continue
        if ta not in constructors or tb not in constructors or pair not in (None, (ta, tb)):
            return None
        pair = (ta, tb)
    if pair is None:
        return None
    name = re.compile(rf"(?<![\w-]){re.escape(pair[0])}(?![\w-])")
    for (ka, ta), (_, tb) in zip(a, b):
        if ka == "str" and ta != tb and name.sub(pair[1], ta) != tb:
            return None
        if ka in ("var", "lit") and ta != tb:
            return None
    return pair


def repeated_rules(sources: dict[str, str], constructors: set[str] | None = None) -> list[tuple]:
    """Pairs of rules, over all `sources` (label -> egglog text), that are the same up to one
    constructor name: [(label:line, label:line, name, name, constructor, constructor)].
    `constructors`: the names that count (default: those the sources declare)."""
    parsed = {label: read_forms(text) for label, text in sources.items()}
    if constructors is None:
        constructors = _constructors(f for forms in parsed.values() for f in forms)
    rules = [(label, f) for label, forms in parsed.items() for f in forms
             if isinstance(f, Form) and f.head in RULE_HEADS and not _is_classification_fact(f)]
    buckets: dict[tuple, list] = {}
    for label, f in rules:
        toks = _tokens(f)
        skeleton = tuple(("head", "_") if k == "head" and t in constructors else
                         ("str", "_") if k == "str" else (k, t) for k, t in toks)
        buckets.setdefault(skeleton, []).append((label, f, toks))
    found = []
    for group in buckets.values():
        for (la, fa, ta), (lb, fb, tb) in itertools.combinations(group, 2):
            pair = _one_name_apart(ta, tb, constructors)
            if pair:
                found.append((f"{la}:{fa.line}", f"{lb}:{fb.line}", _name(fa), _name(fb), *pair))
    return found


def _language_constructors() -> set[str]:
    """The language's constructors, from its egglog text as loaded (language_text expands
    any generated sections of the files)."""
    return _constructors(read_forms(language_text()))


def _builtin_sources() -> dict[str, str]:
    return {str(p.relative_to(ROOT.parent)): p.read_text() for p in EGG_FILES}


def _builtin_pairs() -> dict[tuple, list]:
    """(file, constructor, constructor) -> the pairs of built-in rules found for it."""
    sources = _builtin_sources()
    constructors = _language_constructors()
    assert {"compute", "fused-dot-bias-act", "relu", "clip"} <= constructors    # the detector can see
    out: dict[tuple, list] = {}
    for found in repeated_rules(sources, constructors):
        a, b = found[0].rsplit(":", 1)[0], found[1].rsplit(":", 1)[0]
        key = (Path(a).name, *sorted(found[4:])) if a == b else (f"{a} / {b}", *sorted(found[4:]))
        out.setdefault(key, []).append(found)
    return out


def test_no_builtin_rule_family_is_unrolled_by_copy():
    found = [p for key, pairs in _builtin_pairs().items()
             if len(pairs) > ALLOWED.get(key, (0, ""))[0] for p in pairs]
    assert not found, ("rules the same up to one constructor name (fold them into a relation over the "
                       "constructors and one rule querying it):\n" +
                       "\n".join(f"  {a} ~ {b} ({na} / {nb}: {x} -> {y})" for a, b, na, nb, x, y in found))


def test_every_allowed_pair_still_occurs():
    """An ALLOWED entry whose copies are gone (folded away) leaves ALLOWED too."""
    counts = {key: len(pairs) for key, pairs in _builtin_pairs().items()}
    stale = {key: n for key, (n, _) in ALLOWED.items() if counts.get(key, 0) != n}
    assert not stale, f"ALLOWED counts that no longer match the files: {stale}"


# ---- the detector itself -------------------------------------------------------------------



# fusion.egg before its activations became `(activation op)`: a rewrite per activation and
# variant, 20 in all (four activations and one variant of the unbiased family shown here)
UNROLLED = """
; relu(fused-dot-bias a b c) -> fused-dot-bias-act relu a b c
(rewrite (compute (relu) (fused-dot-bias a b c)) (fused-dot-bias-act (relu) a b c)
         :ruleset fusion :name "fusion/relu")
; clip lo hi (relu6)(fused-dot-bias a b c) -> fused-dot-bias-act clip lo hi (relu6) a b c
(rewrite (compute (clip lo hi) (fused-dot-bias a b c)) (fused-dot-bias-act (clip lo hi) a b c)
         :ruleset fusion :name "fusion/clip")
; gelu(fused-dot-bias a b c) -> fused-dot-bias-act gelu a b c
(rewrite (compute (gelu) (fused-dot-bias a b c)) (fused-dot-bias-act (gelu) a b c)
         :ruleset fusion :name "fusion/gelu")
; relu(dot(a x b)) -> fused-dot-bias-act relu a b 0
(rule ((= e (compute (relu) (compute (dot-product) (access-cartesian-product a b)))) (= (split b) 1) (= m (dim b 0)))
      ((union e (fused-dot-bias-act (relu) a b
         (access-broadcast (access-reshape (access-literal 0.0) (access-shape (icons 1 (inil)) (inil)))
                           (access-shape (icons m (inil)) (inil))))))
      :ruleset fusion :name "fusion/relu-unbiased")
; tanh(dot(a x b)) -> fused-dot-bias-act tanh a b 0
(rule ((= e (compute (tanh) (compute (dot-product) (access-cartesian-product a b)))) (= (split b) 1) (= m (dim b 0)))
      ((union e (fused-dot-bias-act (tanh) a b
         (access-broadcast (access-reshape (access-literal 0.0) (access-shape (icons 1 (inil)) (inil)))
                           (access-shape (icons m (inil)) (inil))))))
      :ruleset fusion :name "fusion/tanh-unbiased")
; sigmoid(dot(a x b)) -> fused-dot-bias-act sigmoid a b 0, in another ruleset
(rule ((= e (compute (sigmoid) (compute (dot-product) (access-cartesian-product a b)))) (= (split b) 1) (= m (dim b 0)))
      ((union e (fused-dot-bias-act (sigmoid) a b
         (access-broadcast (access-reshape (access-literal 0.0) (access-shape (icons 1 (inil)) (inil)))
                           (access-shape (icons m (inil)) (inil))))))
      :ruleset other :name "other/sigmoid-unbiased")
"""
# the same as one relation and one rule per variant
FOLDED = """
(relation activation (ComputeOp))
(rule ((= o (relu))) ((activation o)) :ruleset shapes)
(rule ((= o (gelu))) ((activation o)) :ruleset shapes)
(rule ((= o (clip lo hi))) ((activation o)) :ruleset shapes)
; act(fused-dot-bias a b c), act an activation -> fused-dot-bias-act act a b c
(rewrite (compute o (fused-dot-bias a b c)) (fused-dot-bias-act o a b c)
         :when ((activation o)) :ruleset fusion :name "fusion/activation")
"""


def test_detector_finds_the_hand_unrolled_activation_family():
    """relu ~ gelu and relu-unbiased ~ tanh-unbiased; clip (it has arguments) and the copy
    in another ruleset (one rule cannot cover two rulesets) are no pairs."""
    found = repeated_rules({"fusion.egg": UNROLLED}, _language_constructors())
    assert sorted(found) == [
        ("fusion.egg:12", "fusion.egg:18", "fusion/relu-unbiased", "fusion/tanh-unbiased", "relu", "tanh"),
        ("fusion.egg:3", "fusion.egg:9", "fusion/relu", "fusion/gelu", "relu", "gelu")]


def test_detector_passes_the_folded_family_and_classification_facts():
    assert repeated_rules({"fusion.egg": FOLDED}, _language_constructors()) == []


SHAPE_CHECKS = """
(rule ((= e (access-squeeze x k)) (< k 0)) ((shape-invalid e "access-squeeze: negative axis")) :ruleset shapes)
(rule ((= e (access-squeeze x k)) (< k 1)) ((shape-invalid e "access-squeeze: negative axis")) :ruleset shapes)
(rule ((= e (access-flatten x)) (< k 0)) ((shape-invalid e "access-flatten: negative axis")) :ruleset shapes)
(rule ((= e (access x k)) (< k 0)) ((shape-invalid e "access: another reason")) :ruleset shapes)
(rule ((= f (access-insert-axis y j)) (< j 0)) ((shape-invalid f "access-insert-axis: negative axis")) :ruleset shapes)
"""


def test_detector_substitutes_the_name_in_strings_and_renames_variables():
    """Line 1 ~ line 5: another constructor, its name in the message, other variable names.
    Not pairs: another literal (2), another arity (3), another message (4)."""
    found = repeated_rules({"s.egg": SHAPE_CHECKS}, _language_constructors())
    assert [(a, b, x, y) for a, b, _, _, x, y in found] == [
        ("s.egg:2", "s.egg:6", "access-squeeze", "access-insert-axis")]
