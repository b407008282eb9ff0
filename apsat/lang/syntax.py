"""Surface syntax: Glenside's s-expressions to Terms and back, and Terms to egglog text.

Surface form (what `apsat.parse` reads and `to_text` writes):
    (compute dot-product (access-cartesian-product (access (access-tensor w) 1)
                                                   (access (access-tensor x) 1)))
    lists `(list 1 0)`, shapes `(shape 3 3 3)`, access shapes
    `(access-shape (shape 8) (shape 3))`, opaque arguments `(args e1 e2)`,
    compute operators `relu` or `(clip 0.0 6.0)`, pad types `zero-padding`.
Pattern variables `?name` are allowed where a sub-term goes when `allow_vars=True`.

egglog form (what the e-graph is fed): the same constructor names; int tuples become
cons-lists `(icons 1 (icons 0 (inil)))`, opaque arguments `(econs e (enil))`, nullary
constructors are parenthesised, names are strings.
"""
from __future__ import annotations

import math
import re

from apsat.lang.ops import COMPUTE_OPS, EGG_NAMES, OPS, PAD_TYPES
from apsat.lang.term import Term, postorder, write_pieces
from apsat.errors import ParseError

VAR = "?var"  # op name of a pattern variable term: Term(VAR, (name,))
_TOKEN = re.compile(r'\s*(?:(\()|(\))|("(?:[^"\\]|\\.)*")|([^\s()";]+)|(;[^\n]*))')


def _tokenize(text: str) -> list[tuple[str, int]]:
    tokens, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            if text[pos:].strip() == "":
                break
            raise ParseError(f"parse: unexpected character {text[pos]!r} at offset {pos}")
        pos = m.end()
        if m.group(5):
            continue
        tok = next(g for g in m.groups()[:4] if g is not None)
        tokens.append((tok, m.start(m.lastindex)))
    return tokens


def _read_sexprs(text: str) -> list:
    """Nested lists of (token, offset) atoms; explicit stack, so deep terms are fine."""
    stack: list[list] = [[]]
    for tok, off in _tokenize(text):
        if tok == "(":
            stack.append([])
        elif tok == ")":
            if len(stack) == 1:
                raise ParseError(f"parse: unbalanced ')' at offset {off}")
            done = stack.pop()
            stack[-1].append(done)
        else:
            stack[-1].append((tok, off))
    if len(stack) != 1:
        raise ParseError("parse: missing ')' at end of text")
    return stack[0]


def _atom(node, what: str, ctx: str):
    if isinstance(node, list):
        raise ParseError(f"parse: {ctx}: expected {what}, found a parenthesised form")
    return node[0]


def _number(node, ctx, kind):
    """An int or float literal token; ParseError saying which was expected."""
    what = "an integer" if kind is int else "a number"
    tok = _atom(node, what, ctx)
    try:
        return kind(tok)
    except ValueError:
        raise ParseError(f"parse: {ctx}: expected {what}, found {tok!r}") from None


def _int(node, ctx):
    return _number(node, ctx, int)


def _float(node, ctx):
    return _number(node, ctx, float)


def _ints(node, ctx):
    if not isinstance(node, list) or not node or isinstance(node[0], list) \
            or node[0][0] not in ("list", "shape"):
        raise ParseError(f"parse: {ctx}: expected (list ...) or (shape ...)")
    return tuple(_int(n, ctx) for n in node[1:])


def _name(node, ctx):
    tok = _atom(node, "a name", ctx)
    return tok[1:-1] if tok.startswith('"') else tok


def _compute_op(node, ctx, allow_vars: bool = False):
    """A compute operator term: `relu`, `(clip 0.0 6.0)`, or one with operator parameters,
    `(chain elementwise-add relu)` (read recursively; chains are a few levels deep)."""
    head, params = (node, []) if not isinstance(node, list) else (node[0], node[1:])
    name = _atom(head, "a compute operator", ctx)
    if allow_vars and name.startswith("?") and not params:
        return Term(VAR, (name[1:],))
    spec = COMPUTE_OPS.get(name)
    if spec is None:
        raise ParseError(f"parse: {ctx}: unknown compute operator {name!r}")
    if len(params) != len(spec.params):
        raise ParseError(f"parse: {ctx}: {name} takes {len(spec.params)} parameters, got {len(params)}")
    vals = []
    for k, p in zip(spec.params, params):
        if k == "compute-op":
            vals.append(_compute_op(p, name, allow_vars))
        else:
            vals.append(_int(p, name) if k == "int" else _float(p, name))
    return Term(name, tuple(vals))


def parse_compute_op(text: str) -> Term:
    """A compute operator written on its own in surface syntax (`relu`, `(clip 0.0 6.0)`,
    `(chain elementwise-add relu)`), as compute_op_text writes it."""
    forms = _read_sexprs(text)
    if len(forms) != 1:
        raise ParseError(f"parse: expected one compute operator, found {len(forms)} forms")
    return _compute_op(forms[0], "compute operator")


def _build(node, allow_vars: bool, names: dict | None = None) -> Term:
    """Build one Expr term from a parsed s-expression (iteratively over expr children)."""
    # Forms are visited twice: to push their expr children, then (ready) to build from `cache`.
    cache: dict[int, Term] = {}
    stack = [(node, False)]
    while stack:
        cur, ready = stack.pop()
        if not isinstance(cur, list):
            cache[id(cur)] = _leaf(cur, allow_vars, names)
            continue
        op, spec, args, subs = _form(cur)
        if not ready:
            stack.append((cur, True))
            stack.extend((s, False) for s in subs if id(s) not in cache)
            continue
        vals = [_arg_value(k, a, op, cache, allow_vars) for k, a in zip(spec.signature, args)]
        cache[id(cur)] = Term(op, tuple(vals))
    return cache[id(node)]


def _leaf(atom, allow_vars: bool, names: dict | None) -> Term:
    """An expression written as a bare token: a pattern variable `?x` (with allow_vars) or
    a name `%N` bound by an earlier line of the DAG form (with names)."""
    tok = atom[0]
    if allow_vars and tok.startswith("?"):
        return Term(VAR, (tok[1:],))
    if names is not None and tok.startswith("%"):
        if tok not in names:
            raise ParseError(f"parse: {tok} is used before it is defined (offset {atom[1]})")
        return names[tok]
    raise ParseError(f"parse: expected an expression, found {tok!r} at offset {atom[1]}")


def _form(form: list):
    """(op, its OpSpec, the arguments, the expr children in build order) of an op form,
    checked against the op's signature."""
    if not form or isinstance(form[0], list):
        raise ParseError("parse: expected an operator name after '('")
    op = form[0][0]
    spec = OPS.get(op)
    if spec is None:
        raise ParseError(f"parse: unknown op {op!r} at offset {form[0][1]}")
    args = form[1:]
    if len(args) != len(spec.signature):
        raise ParseError(f"parse: {op} takes {len(spec.signature)} arguments "
                         f"({' '.join(spec.signature)}), got {len(args)}")
    subs = [a for k, a in zip(spec.signature, args) if k == "expr"]
    for k, a in zip(spec.signature, args):
        if k == "exprs":
            if not isinstance(a, list) or not a or _atom(a[0], "args", op) != "args":
                raise ParseError(f"parse: {op}: expected (args ...)")
            subs.extend(a[1:])
    return op, spec, args, subs


_LITERAL_READERS = {"int": _int, "float": _float, "name": _name, "list": _ints, "shape": _ints}


def _arg_value(kind: str, a, op: str, cache: dict, allow_vars: bool):
    """The value of argument `a` of `op`, of signature kind `kind` (expr children from
    `cache`, built already)."""
    if allow_vars and kind != "expr" and not isinstance(a, list) and a[0].startswith("?"):
        return Term(VAR, (a[0][1:],))  # a pattern variable in a literal slot
    if kind == "expr":
        return cache[id(a)]
    if kind == "exprs":
        return tuple(cache[id(s)] for s in a[1:])
    if kind in _LITERAL_READERS:
        return _LITERAL_READERS[kind](a, op)
    if kind == "access-shape":
        if not isinstance(a, list) or len(a) != 3 or _atom(a[0], "access-shape", op) != "access-shape":
            raise ParseError(f"parse: {op}: expected (access-shape (shape ..) (shape ..))")
        return Term("access-shape", (_ints(a[1], op), _ints(a[2], op)))
    if kind == "pad-type":
        pad = _atom(a, "a pad type", op)
        if pad not in PAD_TYPES:
            raise ParseError(f"parse: {op}: unknown pad type {pad!r} (use {', '.join(PAD_TYPES)})")
        return Term(pad, ())
    if kind == "compute-op":
        return _compute_op(a, op, allow_vars)
    raise ValueError(f"signature kind {kind!r} of {op} has no reader")


def parse_term(text: str, allow_vars: bool = False) -> Term:
    """Parse one surface-syntax expression into a Term; ParseError names what is wrong."""
    forms = _read_sexprs(text)
    if len(forms) != 1:
        raise ParseError(f"parse: expected one expression, found {len(forms)}")
    return _build(forms[0], allow_vars)


def parse_dag_text(text: str) -> dict[str, Term]:
    """Read the DAG form `to_dag_text` writes: lines `%N = EXPR` bind shared terms, lines
    `output NAME = EXPR` name outputs; `%N` may be used in later lines. Returns the outputs."""
    names: dict[str, Term] = {}
    outputs: dict[str, Term] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.split(";", 1)[0].strip()
        if not line:
            continue
        lhs, sep, rhs = line.partition("=")
        lhs = lhs.split()
        if not sep or not (len(lhs) == 1 and lhs[0].startswith("%") or len(lhs) == 2 and lhs[0] == "output"):
            raise ParseError(f"line {lineno}: expected '%N = EXPR' or 'output NAME = EXPR'")
        forms = _read_sexprs(rhs)
        if len(forms) != 1:
            raise ParseError(f"line {lineno}: expected one expression")
        form = forms[0]
        term = names[form[0]] if not isinstance(form, list) and form[0] in names else _build(form, False, names)
        if lhs[0] == "output":
            outputs[lhs[1]] = term
        else:
            names[lhs[0]] = term
    if not outputs:
        raise ParseError("no 'output NAME = EXPR' line")
    return outputs


# ---- printing ----------------------------------------------------------------------------

def _fmt_float(x: float) -> str:
    if math.isnan(x) or math.isinf(x):
        raise ParseError(f"a literal {x} cannot be written in the language")
    text = repr(float(x))
    return text if ("." in text or "e" in text) else text + ".0"


def _fmt_name(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z_][\w\-./:]*", name) else '"' + name.replace('"', '\\"') + '"'


def _fmt_arg(kind: str, value, sub) -> str:
    if isinstance(value, Term) and value.op == VAR:
        return "?" + value.args[0]
    if kind == "expr":
        return sub(value)
    if kind == "exprs":
        return "(args" + "".join(" " + sub(v) for v in value) + ")"
    if kind == "int":
        return str(value)
    if kind == "float":
        return _fmt_float(value)
    if kind == "name":
        return _fmt_name(value)
    if kind in ("list", "shape"):
        return "(" + " ".join([kind] + [str(v) for v in value]) + ")"
    if kind == "access-shape":
        return f"(access-shape {_fmt_arg('shape', value.args[0], sub)} {_fmt_arg('shape', value.args[1], sub)})"
    if kind == "pad-type":
        return value.op
    if kind == "compute-op":
        return compute_op_text(value)
    raise AssertionError(kind)


def compute_op_text(op: Term) -> str:
    """Surface syntax of a compute operator term: `relu`, `(clip 0.0 6.0)`,
    `(chain elementwise-add relu)`."""
    if op.op == VAR:
        return "?" + op.args[0]
    spec = COMPUTE_OPS[op.op]
    if not spec.params:
        return op.op
    return "(" + " ".join([op.op] + [_param_text(k, p, compute_op_text, str)
                                     for k, p in zip(spec.params, op.args)]) + ")"


def _param_text(kind: str, value, operator, integer) -> str:
    """One compute-operator parameter: `operator(term)` for an operator, else a literal."""
    if kind == "compute-op":
        return operator(value)
    return integer(value) if kind == "int" else _fmt_float(value)


def _pieces(t: Term) -> list:
    """t's text as pieces (term.write_pieces): strings, and its expr children as Terms."""
    if t.op == VAR:
        return ["?" + t.args[0]]
    out = ["(" + t.op]
    for kind, v in zip(OPS[t.op].signature, t.args):
        if kind == "exprs":
            out += [" (args", *(p for c in v for p in (" ", c)), ")"]
        else:
            out += [" ", v] if kind == "expr" else [" " + _fmt_arg(kind, v, None)]
    return out + [")"]


def to_text(term: Term) -> str:
    """Surface syntax of a term (shared sub-terms are written out at each use)."""
    return "".join(write_pieces(term, _pieces, [], {}))


def to_dag_text(outputs: dict[str, Term]) -> str:
    """Text of a program that stays linear in its DAG size: every term used more than once
    is bound once (`%N = EXPR`, children first) and referred to by name; single-use terms
    are written inline. Ends with one `output NAME = EXPR` line per output."""
    order = postorder(list(outputs.values()))
    uses: dict[int, int] = {}
    for t in order:
        for c in t.children():
            uses[id(c)] = uses.get(id(c), 0) + 1
    names: dict[int, str] = {}
    out: list = []
    for t in order:
        if uses.get(id(t), 0) > 1:
            names[id(t)] = f"%{len(names)}"
            out.append(f"{names[id(t)]} = ")
            write_pieces(t, _pieces, out, names, own=t).append("\n")
    for name, t in outputs.items():
        out.append(f"output {name} = ")
        write_pieces(t, _pieces, out, names).append("\n")
    return "".join(out)


# ---- egglog text ---------------------------------------------------------------------------

def egg_ints(values) -> str:
    """An int tuple as an egglog cons-list."""
    out = "(inil)"
    for v in reversed(values):
        out = f"(icons {int(v)} {out})"
    return out


def egg_string(name: str) -> str:
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def egg_node(term: Term, ref) -> str:
    """egglog text of one node; `ref(child)` gives the text standing for a child Expr
    (a global name when loading statement by statement, a variable in a pattern)."""
    if term.op == VAR:
        return term.args[0]
    spec = OPS[term.op]
    parts = [term.op]
    for kind, value in zip(spec.signature, term.args):
        if isinstance(value, Term) and value.op == VAR:
            parts.append(value.args[0])
        elif kind == "expr":
            parts.append(ref(value))
        elif kind == "exprs":
            out = "(enil)"
            for v in reversed(value):
                out = f"(econs {ref(v)} {out})"
            parts.append(out)
        elif kind == "int":
            parts.append(str(int(value)))
        elif kind == "float":
            parts.append(_fmt_float(value))
        elif kind == "name":
            parts.append(egg_string(value))
        elif kind in ("list", "shape"):
            parts.append(egg_ints(value))
        elif kind == "access-shape":
            parts.append(f"(access-shape {egg_ints(value.args[0])} {egg_ints(value.args[1])})")
        elif kind == "pad-type":
            parts.append(f"({value.op})")
        elif kind == "compute-op":
            parts.append(egg_compute_op(value))
    return "(" + " ".join(parts) + ")"


def egg_compute_op(op: Term) -> str:
    """egglog text of a compute operator term: `(relu)`, `(sqrt-op)`, `(clip 0.0 6.0)`,
    `(chain (elementwise-add) (relu))`; a pattern variable stays a variable."""
    if op.op == VAR:
        return op.args[0]
    spec = COMPUTE_OPS[op.op]
    name = EGG_NAMES.get(op.op, op.op)
    params = [_param_text(k, p, egg_compute_op, lambda v: str(int(v)))
              for k, p in zip(spec.params, op.args)]
    return "(" + " ".join([name] + params) + ")"
