"""Checks every extraction result must pass, whatever extractor produced it."""
from __future__ import annotations

from apsat.extract.graph import ExtractionGraph


class InvalidExtraction(AssertionError):
    """An extraction that is not a program: a missing class, a foreign node, or a cycle."""


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


def check_acyclic(graph: ExtractionGraph, choice: dict[str, str], roots) -> None:
    """Raise InvalidExtraction when the chosen nodes form a cycle (iterative DFS, colours)."""
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    for root in roots:
        if state.get(root) == 2:
            continue
        stack = [(root, iter(graph.node_classes[choice[root]]))]
        state[root] = 1
        while stack:
            c, kids = stack[-1]
            nxt = next(kids, None)
            if nxt is None:
                state[c] = 2
                stack.pop()
                continue
            s = state.get(nxt)
            if s == 1:
                raise InvalidExtraction(f"the chosen program has a cycle through class {nxt}")
            if s is None:
                state[nxt] = 1
                stack.append((nxt, iter(graph.node_classes[choice[nxt]])))


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
