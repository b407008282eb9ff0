"""Clean-ups on the written graph: what the walk leaves for a local pass to remove.

Each pass is a peephole that keeps the graph's meaning: the value a graph output takes is
renamed to the output's name (no Identity), a Reshape of a Reshape reads the first one's
input, a Transpose of a Transpose is one (or none), a Concat of a Concat on one axis is
one, a node equal to an earlier one is that one, and nodes and initializers nothing reads
are dropped.
"""
from __future__ import annotations

from collections import Counter

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
    the inner one."""
    changed, merged_any = True, False
    while changed:
        changed = False
        made, uses = _producers(graph), _uses(graph)
        for node in graph.node:
            if node.op_type != "Concat":
                continue
            axis = helper.get_attribute_value(node.attribute[0])
            for k, name in enumerate(node.input):
                inner = made.get(name)
                if inner is not None and inner.op_type == "Concat" and uses[name] == 1 \
                        and helper.get_attribute_value(inner.attribute[0]) == axis:
                    merged = list(node.input[:k]) + list(inner.input) + list(node.input[k + 1:])
                    del node.input[:]
                    node.input.extend(merged)
                    graph.node.remove(inner)
                    changed = merged_any = True
                    break
            if changed:
                break
    return merged_any


def _common(graph) -> bool:
    """A node equal to an earlier one (op, inputs, attributes): its readers read the
    earlier one's outputs (the walk writes a mask or a layout change once per reader)."""
    seen, changed = {}, False
    outputs = {o.name for o in graph.output}
    for node in list(graph.node):
        if node.op_type.startswith("Random") or node.op_type in ("Multinomial", "Bernoulli"):
            continue
        key = (node.domain, node.op_type, tuple(node.input),
               tuple(sorted(a.SerializeToString() for a in node.attribute)))
        first = seen.setdefault(key, node)
        if first is node or any(o in outputs for o in node.output):
            continue
        for old, new in zip(node.output, first.output):
            _replace_uses(graph, old, new)
        graph.node.remove(node)
        changed = True
    return changed


def _identity_transposes(graph) -> bool:
    """A Transpose by the identity permutation: its readers read its input."""
    changed = False
    for node in list(graph.node):
        if node.op_type == "Transpose":
            perm = list(helper.get_attribute_value(node.attribute[0]))
            if perm == sorted(perm) and node.output[0] not in {o.name for o in graph.output}:
                _replace_uses(graph, node.output[0], node.input[0])
                graph.node.remove(node)
                changed = True
    return changed


def _replace_uses(graph, old: str, new: str) -> None:
    for n in graph.node:
        for k, i in enumerate(n.input):
            if i == old:
                n.input[k] = new


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
    """Drop nodes none of whose outputs is read, then unread initializers."""
    changed = False
    while True:
        uses = _uses(graph)
        dead = [n for n in graph.node if not any(uses[o] for o in n.output)]
        if not dead:
            break
        for n in dead:
            graph.node.remove(n)
        changed = True
    uses = _uses(graph)
    unread = [i for i in graph.initializer if not uses[i.name]]
    for i in unread:
        graph.initializer.remove(i)
    return changed or bool(unread)
