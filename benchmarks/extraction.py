"""Extractors on the extraction-gym benchmark e-graphs in ../shared/bench/extraction: per
e-graph, its size, then DAG cost and seconds for tree, greedy-dag and ilp, the ILP's own
verdict (proven optimal / gap to its lower bound) and the known optimum from REFERENCE.md
with each extractor's gap to it. Every result is checked with check_extraction. A cost
below a known optimum is flagged "BELOW OPTIMUM" (that would be a bug).

Usage: python benchmarks/extraction.py [--time-limit S] [--acyclic order|cuts] [SUBSTRING ...]
"""
from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / ".." / "shared" / "bench" / "extraction"


def known_optima(bench: Path) -> dict[str, float]:
    """file (relative to `bench`) -> optimum DAG cost, from REFERENCE.md's table."""
    ref = bench / "REFERENCE.md"
    out = {}
    if ref.exists():
        for line in ref.read_text().splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) == 5 and cells[0].endswith(".json") and re.fullmatch(r"[0-9.]+", cells[4]):
                out[cells[0]] = float(cells[4])
    return out


def measure(path: Path, time_limit: float, acyclic: str) -> dict:
    """Run the three extractors on one e-graph; returns the row's figures."""
    from apsat.extract.check import check_extraction, dag_cost
    from apsat.extract.graph import ExtractionGraph
    from apsat.extract.greedy_dag import extract_greedy_dag
    from apsat.extract.ilp import extract_ilp
    from apsat.extract.tree import extract_tree

    g = ExtractionGraph.from_json(path)
    row = {"nodes": len(g.nodes), "classes": len(g.classes)}
    runs = {"tree": extract_tree, "greedy-dag": extract_greedy_dag,
            "ilp": lambda g, roots: extract_ilp(g, roots, time_limit=time_limit, acyclic=acyclic)}
    for name, fn in runs.items():
        t = time.perf_counter()
        choice = fn(g, g.roots)
        row[name + "_s"] = time.perf_counter() - t
        check_extraction(g, choice, g.roots)
        row[name] = dag_cost(g, choice, g.roots)
        if name == "ilp":
            row["optimal"], row["gap"] = choice.optimal, choice.gap
    return row


def _gap(cost, opt):
    if opt is None:
        return ""
    if cost < opt * (1 - 1e-6):
        return "BELOW OPTIMUM"
    return f"{(cost - opt) / opt:.2%}"


def main(argv) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--acyclic", default="order", choices=["order", "cuts"])
    ap.add_argument("only", nargs="*", help="substrings of e-graph paths to run")
    args = ap.parse_args(argv)
    bench = BENCH.resolve()
    if not bench.is_dir():
        print(f"no benchmark e-graphs: {bench} is absent; nothing to do")
        return 0
    optima = known_optima(bench)
    files = sorted(p for p in bench.rglob("*.json") if not args.only or any(s in str(p) for s in args.only))
    cols = ["e-graph", "nodes", "classes", "tree", "s", "greedy-dag", "s", "ilp", "s", "ilp proof",
            "optimum", "tree gap", "greedy gap", "ilp gap"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    bad = False
    for path in files:
        rel = str(path.relative_to(bench))
        r = measure(path, args.time_limit, args.acyclic)
        opt = optima.get(rel)
        proof = "optimal" if r["optimal"] else (f"gap {r['gap']:.2%}" if r["gap"] is not None else "no bound")
        gaps = [_gap(r[m], opt) for m in ("tree", "greedy-dag", "ilp")]
        bad |= "BELOW OPTIMUM" in gaps
        cells = [rel, r["nodes"], r["classes"], f"{r['tree']:.6g}", f"{r['tree_s']:.2f}",
                 f"{r['greedy-dag']:.6g}", f"{r['greedy-dag_s']:.2f}", f"{r['ilp']:.6g}", f"{r['ilp_s']:.2f}",
                 proof, "" if opt is None else f"{opt:.6g}", *gaps]
        print("| " + " | ".join(str(c) for c in cells) + " |", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
