"""Clean-ups on the written graph: what the walk leaves for a local pass to remove.

Each pass is a peephole that keeps the graph's meaning: the value a graph output takes is
renamed to the output's name (no Identity), a Reshape of a Reshape reads the first one's
input, a Transpose of a Transpose is one (or none), a Concat of a Concat on one axis is
one, a node equal to an earlier one is that one, and nodes and initializers nothing reads
are dropped.
"""
from __future__ import annotations

from collections import Counter

import onnx
from onnx import helper, numpy_helper


def tidy(graph) -> None:
    """Apply every pass, in place, until none changes anything."""
    for _ in range(8):
        changed = _common(graph)
        changed |= _chains(graph)
        changed |= _rename_outputs(graph)
        changed |= _dead(graph)
        if not changed:
            break


def _producers(graph) -> dict:
    return {o: n for n in graph.node for o in n.output}


def _uses(graph) -> Counter:
    uses = Counter(i for n in graph.node for i in n.input)
    uses.update(o.name for o in graph.output)
    return uses


def _chains(graph) -> bool:
    """Reshape(Reshape(x)) -> Reshape(x); Transpose(Transpose(x)) -> Transpose(x) or x."""
    made, changed = _producers(graph), False
    consts = {i.name: i for i in graph.initializer}
    for node in list(graph.node):
        if not node.input:
            continue
        inner = made.get(node.input[0])
        if inner is None or inner.op_type != node.op_type:
            continue
        if node.op_type == "Reshape" and node.input[1] in consts and 0 not in numpy_helper.to_array(consts[node.input[1]]):
            node.input[0] = inner.input[0]
            changed = True
        elif node.op_type == "Transpose":
            p1 = list(helper.get_attribute_value(inner.attribute[0]))
            p2 = list(helper.get_attribute_value(node.attribute[0]))
            combined = [p1[i] for i in p2]
            node.input[0] = inner.input[0]
            del node.attribute[:]
            node.attribute.extend([helper.make_attribute("perm", combined)])
            changed = True
    changed |= _identity_transposes(graph)
    return changed | _concats(graph)


def _concats(graph) -> bool:
    """Concat(Concat(a, b), c) on one axis -> Concat(a, b, c) where nothing else reads
    the inner one. One pass in graph order (an inner Concat is merged before its reader),
    the merged ones removed at once: a rescan after each merge was quadratic in a chain."""
    nodes, uses, merged = list(graph.node), _uses(graph), set()
    made = {o: k for k, n in enumerate(nodes) for o in n.output}
    for node in nodes:
        if node.op_type != "Concat":
            continue
        axis = helper.get_attribute_value(node.attribute[0])
        inputs = []
        for name in node.input:
            k = made.get(name)
            inner = None if k is None else nodes[k]
            if inner is not None and inner.op_type == "Concat" and uses[name] == 1 \
                    and helper.get_attribute_value(inner.attribute[0]) == axis:
                inputs.extend(inner.input)
                merged.add(k)
            else:
                inputs.append(name)
        if len(inputs) != len(node.input):
            del node.input[:]
            node.input.extend(inputs)
    _drop(graph, merged)
    return bool(merged)


def _common(graph) -> bool:
    """A node equal to an earlier one (op, inputs, attributes): its readers read the
    earlier one's outputs (the walk writes a mask or a layout change once per reader).
    One pass, renaming inputs as nodes come (so a node made equal by a renaming is found
    too), the duplicates removed at once: a scan of the graph a duplicate was quadratic."""
    seen, renamed, dropped = {}, {}, set()
    outputs = {o.name for o in graph.output}
    for k, node in enumerate(graph.node):
        _rename_inputs(node, renamed)
        if node.op_type.startswith("Random") or node.op_type in ("Multinomial", "Bernoulli"):
            continue
        key = (node.domain, node.op_type, tuple(node.input),
               tuple(sorted(a.SerializeToString() for a in node.attribute)))
        first = seen.setdefault(key, node)
        if first is node or any(o in outputs for o in node.output):
            continue
        renamed.update(zip(node.output, first.output))
        dropped.add(k)
    _finish_renaming(graph, renamed, dropped)
    return bool(dropped)


def _identity_transposes(graph) -> bool:
    """A Transpose by the identity permutation: its readers read its input (one pass, as
    _common)."""
    renamed, dropped = {}, set()
    outputs = {o.name for o in graph.output}
    for k, node in enumerate(graph.node):
        _rename_inputs(node, renamed)
        if node.op_type == "Transpose":
            perm = list(helper.get_attribute_value(node.attribute[0]))
            if perm == sorted(perm) and node.output[0] not in outputs:
                renamed[node.output[0]] = node.input[0]
                dropped.add(k)
    _finish_renaming(graph, renamed, dropped)
    return bool(dropped)


def _rename_inputs(node, renamed: dict) -> None:
    """node's inputs through `renamed` (old name -> new; a chain followed to its end)."""
    for k, i in enumerate(node.input):
        if i in renamed:
            while i in renamed:
                i = renamed[i]
            node.input[k] = i


def _finish_renaming(graph, renamed: dict, dropped: set) -> None:
    """Every node's inputs through `renamed` (a reader placed before its producer too),
    then the nodes at the positions in `dropped` removed."""
    if renamed:
        for node in graph.node:
            _rename_inputs(node, renamed)
    _drop(graph, dropped)


def _drop(graph, dropped: set) -> None:
    """Remove the nodes at the positions in `dropped`, in one rebuild of the node list
    (graph.node.remove searches the list for each node: quadratic over many)."""
    if dropped:
        kept = [onnx.NodeProto.FromString(n.SerializeToString())
                for k, n in enumerate(graph.node) if k not in dropped]
        del graph.node[:]
        graph.node.extend(kept)


def _rename_outputs(graph) -> bool:
    """Identity(x) -> output: x's producer writes the output's name when nothing else
    reads x and x is no graph input or initializer."""
    made, uses, changed = _producers(graph), _uses(graph), False
    for node in list(graph.node):
        if node.op_type != "Identity" or node.output[0] not in {o.name for o in graph.output}:
            continue
        src = made.get(node.input[0])
        if src is None or uses[node.input[0]] != 1:
            continue
        k = list(src.output).index(node.input[0])
        src.output[k] = node.output[0]
        graph.node.remove(node)
        changed = True
    return changed


def _dead(graph) -> bool:
    """Drop nodes none of whose outputs is read, then unread initializers: the nodes a
    graph output does not depend on, found in one walk back from the outputs (a round per
    dead level, removing node by node, was quadratic in a dead chain)."""
    nodes = list(graph.node)
    made = {o: k for k, n in enumerate(nodes) for o in n.output}
    live, stack = set(), [made[o.name] for o in graph.output if o.name in made]
    while stack:
        k = stack.pop()
        if k not in live:
            live.add(k)
            stack.extend(made[i] for i in nodes[k].input if i in made)
    dead = set(range(len(nodes))) - live
    _drop(graph, dead)
    uses = _uses(graph)
    unread = [k for k, i in enumerate(graph.initializer) if not uses[i.name]]
    for k in reversed(unread):      # by position, from the end: no search of the list
        del graph.initializer[k]
    return bool(dead) or bool(unread)
