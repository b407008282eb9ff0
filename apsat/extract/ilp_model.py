"""The HiGHS model of DAG-cost extraction (the mixed-integer program ilp.py describes): a
binary per node, a row per class that has a choice or is a root (at most one node; exactly
one for a root), a row per (node, child class) (a picked node needs a node of the child
class), and, in "order" mode, a topological-order variable per class of a cyclic component
with its rows; "cuts" mode adds cycle cuts as it goes (`add_cuts`). `relaxation` solves the LP relaxation, `solve`
the MIP from a warm start.
"""
from __future__ import annotations

import contextlib
import os
import sys

import numpy as np

from apsat.extract.prune import sccs

_BANNER_SHOWN = False  # HiGHS prints its banner once a process, from C, on the first Highs()


def quiet_highs():
    """A highspy.Highs with its log off (output_flag, log_to_console). HiGHS writes a
    banner to the C stdout when the process's first Highs is built, before any option can
    be set; that one construction runs with file descriptor 1 on /dev/null, so stdout
    carries only what apsat prints (`apsat extract --json` is one JSON object)."""
    import highspy

    global _BANNER_SHOWN
    if _BANNER_SHOWN:
        h = highspy.Highs()
    else:
        _BANNER_SHOWN = True
        with _stdout_to_devnull():
            h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("log_to_console", False)
    return h


@contextlib.contextmanager
def _stdout_to_devnull():
    """File descriptor 1 on /dev/null for the block, C library writes included; the block
    runs unchanged where there is no usable descriptor (an embedding without one)."""
    try:
        sys.stdout.flush()
        _flush_c_stdout()
        saved = os.dup(1)
    except (OSError, ValueError):
        yield
        return
    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 1)
        os.close(null)
        yield
    finally:
        _flush_c_stdout()  # what C buffered inside the block goes to /dev/null, not after it
        os.dup2(saved, 1)
        os.close(saved)


def _flush_c_stdout() -> None:
    """fflush(NULL): flush the C library's stdio buffers."""
    import ctypes

    try:
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass


class HighsModel:
    """The HiGHS model over `members` (class -> nodes, a subset of `pruned.members`):
    columns 0..N-1 are the node binaries, then the order variables. `acyclic` is "order",
    "cuts" or None (no acyclicity rows: for an acyclic restriction)."""

    def __init__(self, members, pruned, roots, acyclic):
        self.h = h = quiet_highs()
        kids = self.kids = pruned.kids
        self.nodes = [n for ns in members.values() for n in ns]
        self.col = col = {n: i for i, n in enumerate(self.nodes)}
        self.cls = {n: c for c, ns in members.items() for n in ns}
        rows: list[tuple[list[int], list[float], float, float]] = []
        rootset = set(roots)
        for c, ns in members.items():
            if len(ns) > 1 or c in rootset:  # one binary alone never exceeds 1
                rows.append(([col[n] for n in ns], [1.0] * len(ns), 1.0 if c in rootset else 0.0, 1.0))
        for n in self.nodes:
            for k in kids[n]:
                idx = [col[n]] + [col[m] for m in members[k]]
                rows.append((idx, [1.0] + [-1.0] * len(members[k]), -np.inf, 0.0))
        self.order: dict[str, tuple[int, float, int]] = {}  # class -> (column, M, component)
        if acyclic == "order":
            rows += self._order_rows(members)
        self.n_order = len(self.order)
        ncol = len(self.nodes) + len(self.order)
        upper = np.ones(ncol)
        costs = np.zeros(ncol)
        costs[: len(self.nodes)] = [pruned.cost[n] for n in self.nodes]
        for i, m, _ in self.order.values():
            upper[i] = m - 1.0
        h.addCols(ncol, costs, np.zeros(ncol), upper, 0, np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(0))
        nb = len(self.nodes)
        h.changeColsIntegrality(nb, np.arange(nb, dtype=np.int32), np.ones(nb, np.uint8))
        self._add_rows(rows)

    def _order_rows(self, members):
        """Order variables and rows for the classes of each cyclic component."""
        rows, n_comp = [], 0
        for comp in sccs(members, self.kids):
            if len(comp) < 2:
                continue
            m = float(len(comp))
            for c in comp:
                self.order[c] = (len(self.nodes) + len(self.order), m, n_comp)
            n_comp += 1
            cs = set(comp)
            for c in comp:
                tc = self.order[c][0]
                for n in members[c]:
                    for k in self.kids[n]:
                        if k in cs:  # t_k - t_c + M x_n <= M - 1
                            rows.append(([self.order[k][0], tc, self.col[n]], [1.0, -1.0, m], -np.inf, m - 1.0))
        return rows

    def _add_rows(self, rows):
        starts, idx, val = [], [], []
        for r_idx, r_val, _, _ in rows:
            starts.append(len(idx))
            idx.extend(r_idx)
            val.extend(r_val)
        self.h.addRows(len(rows), np.array([r[2] for r in rows], float), np.array([r[3] for r in rows], float),
                       len(idx), np.array(starts, np.int32), np.array(idx, np.int32), np.array(val, float))

    def add_cuts(self, cycles):
        """Forbid these cycles: not all nodes of one may be picked together."""
        self._add_rows([([self.col[n] for n in cy], [1.0] * len(cy), -np.inf, len(cy) - 1.0) for cy in cycles])

    def relaxation(self, seconds):
        """Solve the LP relaxation: {node: value}, or None when it did not finish.
        Integrality is restored afterwards, so `solve` can follow on the same model."""
        import highspy

        h, nb = self.h, len(self.nodes)
        cols = np.arange(nb, dtype=np.int32)
        h.changeColsIntegrality(nb, cols, np.zeros(nb, np.uint8))
        h.setOptionValue("time_limit", float(seconds))
        h.run()
        ok = h.getModelStatus() == highspy.HighsModelStatus.kOptimal
        vals = h.getSolution().col_value
        out = {n: vals[i] for n, i in self.col.items()} if ok else None
        h.changeColsIntegrality(nb, cols, np.ones(nb, np.uint8))
        return out

    def solve(self, warm, seconds, rel_gap):
        """Solve from the warm program {class: node} (acyclic, over this model's nodes;
        {} for none). Returns ({class: node} or None, lower bound or None, HiGHS model
        status text)."""
        h = self.h
        if warm and all(n in self.col for n in warm.values()):
            h.setSolution(len(self.nodes) + len(self.order), np.arange(len(self.nodes) + len(self.order),
                          dtype=np.int32), self._start(warm))
        h.setOptionValue("time_limit", float(seconds))
        h.setOptionValue("mip_rel_gap", float(rel_gap))
        h.run()
        status = h.modelStatusToString(h.getModelStatus()).lower()
        info = h.getInfo()
        lb = info.mip_dual_bound if np.isfinite(info.mip_dual_bound) else None
        if int(info.primal_solution_status) < 2:  # 2 = feasible: nothing found otherwise
            return None, lb, status
        vals = h.getSolution().col_value
        return {self.cls[n]: n for n, i in self.col.items() if vals[i] > 0.5}, lb, status

    def _start(self, warm):
        """Column values for the warm program: its node binaries, and order values from a
        post-order rank (children first) ranked within each component."""
        x = np.zeros(len(self.nodes) + len(self.order))
        for n in warm.values():
            x[self.col[n]] = 1.0
        rank = {c: pos for pos, c in enumerate(_post_order(warm, self.kids))}
        by_comp: dict[int, list] = {}
        for c, (i, _, comp) in self.order.items():
            if c in rank:
                by_comp.setdefault(comp, []).append((rank[c], i))
        for items in by_comp.values():
            for r, (_, i) in enumerate(sorted(items)):
                x[i] = float(r)
        return x


def _post_order(choice, kids):
    """Classes of an acyclic program, children before parents."""
    out, done = [], set()
    for root in choice:
        if root in done:
            continue
        stack = [(root, iter(kids[choice[root]]))]
        done.add(root)
        while stack:
            c, it = stack[-1]
            k = next(it, None)
            if k is None:
                out.append(c)
                stack.pop()
            elif k not in done and k in choice:
                done.add(k)
                stack.append((k, iter(kids[choice[k]])))
    return out
