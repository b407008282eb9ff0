"""Drawing an e-graph: Graphviz DOT with e-classes as boxes holding their e-nodes.

`egraph_dot(eg, root, depth)` writes DOT for the e-classes within `depth` child steps of
`root` (all output classes when no root is given). Each e-class is a cluster labelled with
its id and access shape; each e-node a box labelled with its op and literal arguments
(attribute arguments such as `(shape 3 3 3)` or `relu` are folded into the label, so only
Expr children become edges). An edge runs from an e-node to the e-class of its child; the
root class is drawn highlighted. Hovering over a node shows its class and shape.

Whole-model e-graphs are far too large to draw, hence the depth and `max_classes` bounds:
classes beyond them are counted in a note, never silently left out.

`svg(dot_text)` runs Graphviz's `dot`; `dot_available()` says whether it can. Where `dot`
is missing the callers (apsat.explore.view) fall back to a text rendering and say why.
"""
from __future__ import annotations

import html
import shutil
import subprocess
from dataclasses import dataclass

from apsat.lang.ops import OPS
from apsat.lang.term import Term
from apsat.extract.decode import expr_child_classes, language_graph, node_args

MAX_CLASSES = 150


@dataclass
class Drawing:
    """The classes chosen for a drawing, their members and shapes, and what was cut."""

    graph: object             # apsat.extract.graph.ExtractionGraph of the whole e-graph
    classes: list[str]        # class ids drawn, breadth-first from the roots
    roots: list[str]
    shapes: dict
    cut: int                  # classes within the depth that `max_classes` left out
    beyond_depth: bool        # some drawn class has children deeper than `depth`


def neighbourhood(eg, root=None, depth: int | None = 2, max_classes: int = MAX_CLASSES) -> Drawing:
    """The e-classes within `depth` child steps of `root` (a handle, or None for every
    output of `eg`); depth None means no depth bound. At most `max_classes` are kept,
    nearest first."""
    if depth is not None and depth < 0:
        raise ValueError(f"depth must be >= 0, not {depth}")
    graph = language_graph(eg.serialize())
    roots = [eg.class_of(root)] if root is not None else [eg.class_of(h) for h in eg.outputs.values()]
    seen, frontier, level, deeper = list(dict.fromkeys(roots)), list(dict.fromkeys(roots)), 0, False
    while frontier:
        kids = [k for c in frontier for nid in expr_members(graph, c) for k in expr_child_classes(graph, nid)]
        new = [k for k in dict.fromkeys(kids) if k not in seen]
        if depth is not None and level >= depth:
            deeper = bool(new)
            break
        seen.extend(new)
        frontier, level = new, level + 1
    drawn, cut = seen[:max_classes], max(0, len(seen) - max_classes)
    return Drawing(graph, drawn, roots, graph.shapes or {}, cut, deeper)


def expr_members(graph, cls: str) -> list[str]:
    """The language (Expr) nodes of class `cls`; literal and list nodes left out."""
    return [nid for nid in graph.classes.get(cls, []) if graph.nodes[nid]["op"] in OPS]


def node_label(graph, nid: str) -> str:
    """An e-node as one line: its op and its attribute arguments, Expr children as `·`."""
    args = node_args(graph, nid, lambda c: "·")
    parts = [graph.nodes[nid]["op"]]
    for a in args:
        parts.append(_arg_text(a))
    return " ".join(parts)


def _arg_text(a) -> str:
    if isinstance(a, Term):
        if a.op == "access-shape":
            return "(" + " ".join(_arg_text(x) for x in a.args) + ")"
        return a.op if not a.args else "(" + a.op + " " + " ".join(_arg_text(x) for x in a.args) + ")"
    if isinstance(a, tuple):
        return "(" + " ".join(_arg_text(x) for x in a) + ")"
    return str(a)


def shape_text(shape) -> str:
    """((2, 3), (4,)) -> '(2, 3 | 4)': iterated dims, a bar, item dims."""
    if shape is None:
        return "?"
    it, item = shape
    return "(" + ", ".join(map(str, it)) + " | " + ", ".join(map(str, item)) + ")"


def egraph_dot(drawing: Drawing) -> str:
    """DOT text for a Drawing (see the module doc for what is drawn how)."""
    g, drawn = drawing.graph, set(drawing.classes)
    lines = ['digraph egraph {', '  compound=true; rankdir=TB; newrank=true;',
             '  node [shape=box, style="rounded,filled", fillcolor=white, fontname="monospace", fontsize=10];',
             '  edge [arrowsize=0.6, color="#555555"];']
    anchor = {}
    for cls in drawing.classes:
        members = expr_members(g, cls)
        if not members:
            continue
        anchor[cls] = members[0]
        root = cls in drawing.roots
        shape = shape_text(drawing.shapes.get(cls))
        lines.append(f'  subgraph "cluster_{cls}" {{')
        lines.append(f'    label={_q(cls + "  " + shape)}; tooltip={_q("e-class " + cls + " shape " + shape)};')
        lines.append('    style="rounded,filled"; ' + ('color="#d62728"; penwidth=2.5; fillcolor="#fde8e8";'
                                                      if root else 'color="#888888"; fillcolor="#f4f6fb";'))
        for nid in members:
            lines.append(f'    {_q(nid)} [label={_q(node_label(g, nid))}, tooltip={_q(cls + ": " + shape)}];')
        lines.append('  }')
    for cls in drawing.classes:
        for nid in expr_members(g, cls):
            for k in expr_child_classes(g, nid):
                if k in drawn and k in anchor:
                    lines.append(f'  {_q(nid)} -> {_q(anchor[k])} [lhead={_q("cluster_" + k)}];')
    notes = []
    if drawing.cut:
        notes.append(f"{drawing.cut} more e-classes within the depth not drawn (max_classes)")
    if drawing.beyond_depth:
        notes.append("deeper e-classes not drawn (depth)")
    if notes:
        lines.append(f'  note [shape=note, fillcolor="#fff8dc", label={_q("; ".join(notes))}];')
    lines.append("}")
    return "\n".join(lines)


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def dot_available() -> bool:
    """True when Graphviz's `dot` is on PATH."""
    return shutil.which("dot") is not None


def svg(dot_text: str, timeout: float = 30.0) -> str:
    """SVG text from DOT through `dot -Tsvg`. RuntimeError (one line) when dot is missing
    or fails."""
    exe = shutil.which("dot")
    if exe is None:
        raise RuntimeError("Graphviz `dot` is not installed (Debian: apt-get install graphviz)")
    done = subprocess.run([exe, "-Tsvg"], input=dot_text, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"dot failed: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}")
    return done.stdout


def text_drawing(drawing: Drawing) -> str:
    """The same content as plain text: one block per e-class, its members and children."""
    g = drawing.graph
    out = []
    for cls in drawing.classes:
        mark = " (root)" if cls in drawing.roots else ""
        out.append(f"e-class {cls}{mark} {shape_text(drawing.shapes.get(cls))}")
        for nid in expr_members(g, cls):
            kids = ", ".join(expr_child_classes(g, nid))
            out.append(f"  {node_label(g, nid)}" + (f"  -> {kids}" if kids else ""))
    if drawing.cut:
        out.append(f"... {drawing.cut} more e-classes not drawn")
    return "\n".join(out)


def escape(text: str) -> str:
    """HTML-escaped text (for the fallback rendering inside notebooks)."""
    return html.escape(text)
