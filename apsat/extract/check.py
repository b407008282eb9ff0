"""Checks every extraction result must pass, whatever extractor produced it, and why a
root has no program at all (`check_roots`)."""
from __future__ import annotations

from apsat.errors import ExtractionError
from apsat.extract.graph import ExtractionGraph


class InvalidExtraction(ExtractionError):
    """An extraction that is not a program: a missing class, a foreign node, or a cycle.
    An ApsatError (and a ValueError): a choice read from a file can be any of these."""


def reachable(graph: ExtractionGraph, choice: dict[str, str], roots) -> list[str]:
    """Classes the chosen program uses, starting from `roots`; raises InvalidExtraction when
    a reached class has no chosen node or the choice is not one of the class's nodes."""
    seen, order, stack = set(), [], list(roots)
    while stack:
        c = stack.pop()
        if c in seen:
            continue
        seen.add(c)
        order.append(c)
        nid = choice.get(c)
        if nid is None:
            raise InvalidExtraction(f"class {c} is used but has no chosen node")
        if nid not in graph.nodes or graph.nodes[nid]["eclass"] != c:
            raise InvalidExtraction(f"node {nid} chosen for class {c} is not an extractable member of it")
        stack.extend(graph.node_classes[nid])
    return order


def find_back_edge(graph: ExtractionGraph, choice: dict[str, str], roots) -> str | None:
    """The class that closes a cycle when following `choice` from `roots`, or None when
    the chosen nodes are acyclic (iterative DFS with colours; classes without a choice
    are not followed)."""
    state: dict[str, int] = {}  # 1 = on the DFS stack, 2 = finished
    for root in roots:
        if root not in choice or state.get(root) == 2:
            continue
        state[root] = 1
        stack = [(root, iter(graph.node_classes[choice[root]]))]
        while stack:
            c, it = stack[-1]
            k = next(it, None)
            if k is None:
                state[c] = 2
                stack.pop()
            elif state.get(k) == 1:
                return k
            elif k not in state and k in choice:
                state[k] = 1
                stack.append((k, iter(graph.node_classes[choice[k]])))
    return None


def check_acyclic(graph: ExtractionGraph, choice: dict[str, str], roots) -> None:
    """Raise InvalidExtraction when the chosen nodes form a cycle."""
    closing = find_back_edge(graph, choice, roots)
    if closing is not None:
        raise InvalidExtraction(f"the chosen program has a cycle through class {closing}")


def dag_cost(graph: ExtractionGraph, choice: dict[str, str], roots, node_cost=None) -> float:
    """What the program really costs: every used class paid once (shared work once)."""
    cost = node_cost or graph.cost
    return sum(cost(choice[c]) for c in reachable(graph, choice, roots))


def check_extraction(graph: ExtractionGraph, choice: dict[str, str], roots) -> list[str]:
    """Assert `choice` is a program: one extractable node per used class, all children
    chosen, acyclic. Returns the used classes."""
    used = reachable(graph, choice, roots)
    check_acyclic(graph, choice, roots)
    return used


def check_roots(graph: ExtractionGraph, choice, roots) -> None:
    """ExtractionError (one line, naming the class) when a root in `roots` has no chosen
    node: either some node it needs refers to an e-class with no node (a dangling child)
    or every way down from it comes back to a class on the way (a cycle)."""
    for root in roots:
        if root not in choice:
            raise ExtractionError(f"no program for root e-class {root!r}: {_why_no_program(graph, root)}")


def _why_no_program(graph: ExtractionGraph, root: str) -> str:
    """The reason `root` has no finite program: a dangling child class it reaches, else
    cycles. Classes with a finite program are found by a worklist from the leaves."""
    parents, done = graph.parents(), set()
    waiting = {nid: set(kids) for nid, kids in graph.node_classes.items()}
    ready = [nid for nid, kids in waiting.items() if not kids]
    while ready:
        c = graph.nodes[ready.pop()]["eclass"]
        if c in done:
            continue
        done.add(c)
        for nid in parents.get(c, ()):
            waiting[nid].discard(c)
            if not waiting[nid]:
                ready.append(nid)
    if root not in graph.classes:
        return "the e-graph has no node in it"
    seen, stack = {root}, [root]
    while stack:
        for nid in graph.classes.get(stack.pop(), ()):
            for k in graph.node_classes[nid]:
                if k not in graph.classes:
                    return f"node {nid!r} needs e-class {k!r}, which has no node"
                if k not in seen and k not in done:
                    seen.add(k)
                    stack.append(k)
    return "every node it can use depends on itself through a cycle"
