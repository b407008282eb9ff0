"""S-expressions with line numbers, for validating egglog rule files before egglog sees
them (so a bad file is a `path:line: reason` message, never a Rust panic)."""
from __future__ import annotations

import re
from dataclasses import dataclass

_TOKEN = re.compile(r'\s+|;[^\n]*|\(|\)|"(?:[^"\\\n]|\\.)*"|[^\s()";]+')


@dataclass(frozen=True)
class Atom:
    """A token: `text` as written and the 1-based `line` it starts on."""

    text: str
    line: int


@dataclass
class Form:
    """A parenthesised form: `items` (Atoms and Forms), the `line` of its '(' and the
    character span [start, end) in the source."""

    items: list
    line: int
    start: int
    end: int = -1

    @property
    def head(self) -> str:
        return self.items[0].text if self.items and isinstance(self.items[0], Atom) else ""


class SexprError(ValueError):
    """A syntax error at `line`."""

    def __init__(self, line: int, reason: str):
        super().__init__(reason)
        self.line, self.reason = line, reason


def read_forms(text: str) -> list:
    """Top-level Atoms and Forms of `text`; SexprError for unbalanced parentheses or an
    unterminated string (explicit stack: deep forms are fine)."""
    stack = [Form([], 0, 0)]
    line, pos = 1, 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:  # only an unterminated string can fail to match
            raise SexprError(line, "unterminated string")
        tok = m.group(0)
        if tok == "(":
            stack.append(Form([], line, pos))
        elif tok == ")":
            if len(stack) == 1:
                raise SexprError(line, "unbalanced ')'")
            form = stack.pop()
            form.end = m.end()
            stack[-1].items.append(form)
        elif not tok.isspace() and not tok.startswith(";"):
            stack[-1].items.append(Atom(tok, line))
        line += tok.count("\n")
        pos = m.end()
    if len(stack) > 1:
        raise SexprError(stack[-1].line, "'(' is never closed")
    return stack[0].items


def atoms(node) -> list[Atom]:
    """Every Atom inside a node, in order."""
    out, stack = [], [node]
    while stack:
        n = stack.pop()
        if isinstance(n, Atom):
            out.append(n)
        else:
            stack.extend(reversed(n.items))
    return out


def calls(node) -> list[Form]:
    """Every Form inside a node (the node included), in order."""
    out, stack = [], [node]
    while stack:
        n = stack.pop()
        if isinstance(n, Form):
            out.append(n)
            stack.extend(reversed(n.items))
    return out
