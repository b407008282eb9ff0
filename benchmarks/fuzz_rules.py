"""Malformed rule files for benchmarks/fuzz.py, one generator family a function.

`RULE_FAMILIES` maps a family name to `gen(rng) -> bytes`: the bytes of one `.egg` file.
Most start from one of the project's real rule files (apsat/rules/*.egg) made loadable
beside the built-in ones (`rebased`: its rulesets, helper relations and rule names get an
`fz-` prefix, since a user file may not define a built-in ruleset again) and mutate one of
its rules. `RHS_FAMILIES` are the families whose files are meant to load and then go wrong
in saturation; fuzz.py runs those through `optimize` every time.
"""
from __future__ import annotations

import random
import re
import sys
from functools import lru_cache
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # run from a checkout

from apsat.rules.loader import REFUSED_ACTIONS, language_signatures  # noqa: E402
from apsat.rules.sexpr import Form, calls, read_forms  # noqa: E402

RULE_DIR = Path(__file__).resolve().parent.parent / "apsat" / "rules"
_TOKEN = re.compile(r'\s+|;[^\n]*|\(|\)|"(?:[^"\\\n]|\\.)*"|[^\s()";]+')
_EDGE = r"[\w\-?!*+/<>=.]"


@lru_cache(maxsize=None)
def rebased(name: str) -> str:
    """The real rule file `name` (e.g. "fusion.egg") with its own rulesets, helper
    declarations and rule names prefixed `fz-` / `fz/`: valid beside the built-in files."""
    text = (RULE_DIR / name).read_text()
    forms = [f for f in read_forms(text) if isinstance(f, Form)]
    own = [f.items[1].text for f in forms if f.head in ("ruleset", "function", "relation")]
    for word in own:
        text = re.sub(rf"(?<!{_EDGE}){re.escape(word)}(?!{_EDGE})", f"fz-{word}", text)
    return re.sub(r':name\s+"', ':name "fz/', text)


def _real(rng) -> str:
    return rebased(rng.choice(sorted(p.name for p in RULE_DIR.glob("*.egg"))))


def _rule_forms(text: str) -> list[Form]:
    return [f for f in read_forms(text) if isinstance(f, Form) and f.head in ("rule", "rewrite", "birewrite")]


def _edit_rule(rng, edit) -> str:
    """A real file with one rule's text replaced by `edit(rng, rule_text)`."""
    text = _real(rng)
    form = rng.choice(_rule_forms(text))
    return text[:form.start] + edit(rng, text[form.start:form.end]) + text[form.end:]


def _subforms(rule_text: str) -> list[Form]:
    (form,) = read_forms(rule_text)
    return [f for f in calls(form) if f is not form and f.head]


# ---- families ---------------------------------------------------------------------------------

def parens(rng) -> str:
    """Parentheses deleted or inserted at random."""
    text = _real(rng)
    spots = [i for i, ch in enumerate(text) if ch in "()"]
    for _ in range(rng.choice([1, 1, 2, 5])):
        pos = rng.choice(spots)
        if rng.random() < 0.5:
            text = text[:pos] + text[pos + 1:]
        else:
            text = text[:pos] + rng.choice("()") + text[pos:]
        spots = [i for i, ch in enumerate(text) if ch in "()"]
    return text


def unknown_op(rng) -> str:
    """One call's head renamed to an op that does not exist (a typo, an ONNX name, a global)."""
    def edit(rng, rule):
        f = rng.choice(_subforms(rule))
        head = f.items[0].text
        new = rng.choice([head[:-1] or "z", head + "-x", "frobnicate", "Conv", "relu", "access_tensor", "$x"])
        return rule[:f.start + 1] + rule[f.start + 1:].replace(head, new, 1)
    return _edit_rule(rng, edit)


def _top_items(inner: str) -> list[tuple[int, int]]:
    """(start, end) of each top-level item of a form's inner text."""
    spans, depth = [], 0
    for m in _TOKEN.finditer(inner):
        tok = m.group(0)
        if tok.isspace() or tok.startswith(";"):
            continue
        if depth == 0:
            spans.append([m.start(), m.end()])
        depth += (tok == "(") - (tok == ")")
        spans[-1][1] = m.end()
    return [tuple(s) for s in spans]


def arity(rng) -> str:
    """A call with one argument too many or too few."""
    def edit(rng, rule):
        sig = language_signatures()
        f = rng.choice([f for f in _subforms(rule) if sig.get(f.head)] or _subforms(rule))
        inner = rule[f.start + 1:f.end - 1]
        items = _top_items(inner)
        if rng.random() < 0.5 or len(items) < 2:
            inner += rng.choice([" 0", " x", " (inil)", " 1.5", ' "s"'])
        else:
            lo, hi = items[rng.randrange(1, len(items))]
            inner = inner[:lo] + inner[hi:]
        return rule[:f.start + 1] + inner + rule[f.end - 1:]
    return _edit_rule(rng, edit)


def unbound(rng) -> str:
    """A right side or action using a variable its left side does not bind."""
    def edit(rng, rule):
        forms = _subforms(rule)
        f = forms[-1] if rng.random() < 0.5 else rng.choice(forms)
        var = rng.choice(["fresh", "zz", "?y", "x_unbound"])
        return rule[:f.end - 1] + " " + var + rule[f.end - 1:] if rng.random() < 0.3 else \
            rule[:f.start] + f"(access {var} 0)" + rule[f.end:]
    return _edit_rule(rng, edit)


_FORBIDDEN = sorted(REFUSED_ACTIONS) + ["run", "let", "push", "pop", "check", "set-option", "datatype",
                                       "sort", "print-size", "fail", "simplify", "run-schedule", "constructor",
                                       "query-extract", "unstable-combined-ruleset", "delete", "subsume"]


def forbidden(rng) -> str:
    """A command rule files may not hold (run, let, include, panic, ...) at top level or in an action."""
    text = _real(rng)
    cmd = rng.choice(_FORBIDDEN)
    args = rng.choice(['', ' "/etc/passwd"', " 100", " fz-x (access-tensor \"t\")", ' (relu)', " $g"])
    form = f"({cmd}{args})"
    if rng.random() < 0.5:
        lines = text.split("\n")
        lines.insert(rng.randrange(len(lines) + 1), form)
        return "\n".join(lines)
    rule = rng.choice([f for f in _rule_forms(text) if f.head == "rule"] or _rule_forms(text))
    if rule.head != "rule":
        return text[:rule.start] + f"(rule ((= e (compute (relu) x))) ({form}) :ruleset fz-x)" + text[rule.end:]
    actions = [it for it in rule.items[1:] if isinstance(it, Form)][1]
    return text[:actions.end - 1] + " " + form + text[actions.end - 1:]


def non_utf8(rng) -> bytes:
    """Bytes that are not UTF-8 (stray bytes, Latin-1, UTF-16, random binary) or a UTF-8 byte-order mark."""
    data = _real(rng).encode()
    how = rng.randrange(5)
    if how == 0:
        pos = rng.randrange(len(data))
        return data[:pos] + rng.choice([b"\xff\xfe", b"\x80", b"\xed\xa0\x80", b"\xc3", b"\x00"]) + data[pos:]
    if how == 1:
        return "; caf\u00e9\n".encode("latin-1") + data
    if how == 2:
        return _real(rng).encode("utf-16")
    if how == 3:
        return bytes(rng.randrange(256) for _ in range(rng.choice([1, 100, 4096])))
    return b"\xef\xbb\xbf" + data                      # a UTF-8 byte-order mark


def enormous(rng) -> bytes:
    """50 MB files, 100k rules, deep nesting: refused or handled within the limits."""
    how = rng.randrange(6)
    rule = '(rewrite (compute (relu) (compute (relu) x)) (compute (relu) x) :ruleset fz-big :name "fz/r{}")\n'
    if how == 0:
        return b"(ruleset fz-big)\n" + b"; " + b"x" * (50 << 20) + b"\n"
    if how == 1:
        return ("(ruleset fz-big)\n" + "".join(rule.format(i) for i in range(100_000))).encode()
    if how == 2:
        depth = rng.choice([10_000, 1_000_000])
        return (f"(ruleset fz-big)\n(rewrite {'(compute (relu) ' * depth}x{')' * depth} x :ruleset fz-big)\n").encode()
    if how == 3:
        return ("(ruleset fz-big)\n(rewrite (compute (relu) x) x :ruleset fz-big :name \""
                + "n" * (50 << 20) + '")\n').encode()
    if how == 4:
        return "".join(f"(ruleset fz-r{i})\n" for i in range(100_000)).encode()
    return ("(ruleset fz-big)\n" + "(rewrite (compute (relu) x) x :ruleset fz-big)\n" * 100_000).encode()


_LHS = ["(compute (relu) x)", "(compute (dot-product) (access-cartesian-product x w))"]
_RHS = ["(access x 9)", "(access-transpose x (icons 0 (icons 0 (inil))))", "(access-slice x 0 3 1)",
        "(access-slice x 17 0 1)", "(access-squeeze x 1)", "(access-insert-axis x 99)",
        "(access-pad x (zero-padding) 0 -5 2)", "(access-concatenate x (compute (relu) x) 9)",
        "(access-reshape x (access-shape (icons 7 (inil)) (inil)))", "(access-literal 1.5)",
        "(access-broadcast x (access-shape (icons 3 (inil)) (inil)))", "x", "(compute (negative) x)",
        "(access-slice x 0 0 99999999999999999999)", "(access-windows x (icons 3 (inil)) (icons 0 (inil)))"]


def rhs_shape(rng) -> str:
    """A rule that loads and fires on the fuzz model, with an ill-shaped (or unsound) right side."""
    lhs = rng.choice(_LHS)
    rhs = rng.choice(_RHS)
    if "w" in lhs and rng.random() < 0.5:
        rhs = rng.choice(["(compute (dot-product) (access-cartesian-product w x))",
                          "(compute (dot-product) (access-cartesian-product x x))", rhs])
    if rng.random() < 0.5:
        rule = f"(rewrite {lhs} {rhs} :ruleset fz-shape)"
    else:
        rule = f"(rule ((= e {lhs})) ((union e {rhs})) :ruleset fz-shape)"
    return f"; ill-shaped right side\n(ruleset fz-shape)\n{rule}\n"


def tokens(rng) -> str:
    """Atoms of one rule deleted, doubled, swapped or replaced by odd literals and keywords."""
    def edit(rng, rule):
        toks = [m.group(0) for m in _TOKEN.finditer(rule)]
        atoms = [i for i, t in enumerate(toks) if t not in "()" and not t.isspace()]
        for _ in range(rng.choice([1, 2, 3])):
            i = rng.choice(atoms[1:] or atoms)
            how = rng.randrange(4)
            if how == 0:
                toks[i] = ""
            elif how == 1:
                toks[i] = toks[i] + " " + toks[i]
            elif how == 2:
                toks[i] = rng.choice(["99999999999999999999", "-1", "1e999", "nan", '"\\q"', "\u00e9t\u00e9",
                                      ":ruleset", ":name", ":when", "true", "0.5", "()", '""'])
            else:
                j = rng.choice(atoms)
                toks[i], toks[j] = toks[j], toks[i]
        return "".join(toks)
    return _edit_rule(rng, edit)


def declarations(rng) -> str:
    """Rule names, rulesets and helper declarations that clash or are malformed."""
    text = _real(rng)
    extra = rng.choice([
        "(ruleset fz-dup)\n(ruleset fz-dup)", "(ruleset shapes)", "(ruleset fusion)", "(ruleset)",
        "(ruleset (x))", "(rewrite (compute (relu) x) x :ruleset shapes)",
        "(rewrite (compute (relu) x) x)", "(rewrite (compute (relu) x) x :ruleset)",
        "(rewrite (compute (relu) x) x :ruleset fz-none :name)", "(rewrite (compute (relu) x) x :when)",
        "(relation access (Expr))", "(function fz-f (Frob) i64)", "(function fz-g)", "(relation fz-h Expr)",
        "(function fz-k (i64) i64 :merge (frob old new))", "(relation ndim (Expr))"])
    dup = re.search(r':name\s+"([^"]+)"', text)
    if dup and rng.random() < 0.3:
        extra = f'(rewrite (compute (relu) x) x :ruleset fz-dupname :name "{dup.group(1)}")'
        extra = "(ruleset fz-dupname)\n" + extra
    lines = text.split("\n")
    lines.insert(rng.randrange(len(lines) + 1), extra)
    return "\n".join(lines)


RULE_FAMILIES = {
    "parens": parens, "unknown-op": unknown_op, "arity": arity, "unbound": unbound,
    "forbidden": forbidden, "non-utf8": non_utf8, "enormous": enormous, "rhs-shape": rhs_shape,
    "tokens": tokens, "declarations": declarations}
RHS_FAMILIES = {"rhs-shape"}


def rule_case(family: str, seed: int) -> bytes:
    """The bytes of the rule file of case `seed` of `family` (deterministic)."""
    out = RULE_FAMILIES[family](random.Random(f"{family}:{seed}"))
    return out if isinstance(out, bytes) else out.encode()
