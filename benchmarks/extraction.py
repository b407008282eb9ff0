"""Extractors on the extraction-gym benchmark e-graphs in ../shared/bench/extraction: per
e-graph, its size, then DAG cost and seconds for tree, greedy-dag and ilp, the second at
which the ilp first held its final program ("found"), the ILP's own verdict (proven
optimal / gap to its lower bound) and the known optimum from REFERENCE.md with each
extractor's gap to it. Every result is checked with check_extraction. A cost below a
known optimum is flagged "BELOW OPTIMUM" (that would be a bug).

--steps prints instead, per e-graph with a known optimum (default: the tensat ones), what
each step of the ILP extractor buys: greedy-dag, + local improvement, + pruning (model
size), the full model alone from the greedy start (close to the extractor before these
steps, which pruned less) and
from the improved start ("order" and "cuts"), the LP-support neighbourhood and the
acyclic restriction, and the final result. Seconds there are cumulative within one call.

Usage: python benchmarks/extraction.py [--time-limit S] [--acyclic order|cuts] [--steps] [SUBSTRING ...]
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


def found_at(result) -> float:
    """Seconds into an extract_ilp call at which its final cost was first held (the end of
    the phase that reached it)."""
    phases = result.stats.get("phases", [])
    return next((p["seconds"] for p in phases if p["cost"] <= result.stats["cost"]), result.stats.get("seconds", 0))


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
            row["optimal"], row["gap"], row["found"] = choice.optimal, choice.gap, found_at(choice)
    return row


def steps(path: Path, time_limit: float) -> list[tuple[str, float, float, str]]:
    """What each step of extract_ilp buys on one e-graph: (step, cost, seconds, note) rows.
    Every program is checked on the e-graph before its cost is reported."""
    from apsat.extract.check import check_extraction, dag_cost
    from apsat.extract.graph import ExtractionGraph
    from apsat.extract.ilp import extract_ilp

    g = ExtractionGraph.from_json(path)

    def run(**kw):
        res = extract_ilp(g, g.roots, time_limit=time_limit, **kw)
        check_extraction(g, res, g.roots)
        assert abs(dag_cost(g, res, g.roots) - res.stats["cost"]) <= 1e-9 * max(1.0, res.stats["cost"])
        return res

    def proof(res):
        return "proven optimal" if res.optimal else (f"bound gap {res.gap:.2%}" if res.gap is not None else "no bound")

    final = run()
    rows = []
    for ph in final.stats["phases"]:
        name = {"greedy-dag": "greedy-dag", "local improvement": "+ local improvement",
                "pruning": "+ pruning"}.get(ph["phase"], ph["phase"])
        note = ph.get("status", "")
        if "kept_nodes" in ph:
            kept = f"{ph['kept_nodes']} of {len(g.nodes)} nodes"
            if "kept_classes" in ph:
                kept += f", {ph['kept_classes']} of {len(g.classes)} classes"
            note = f"{kept}; {note}" if note else kept
        rows.append((name, ph["cost"], ph["seconds"], note))
    for label, kw in [("ILP order, greedy start", dict(local_search=False, restrict=False)),
                      ("ILP order, improved start", dict(restrict=False)),
                      ("ILP cuts, improved start", dict(restrict=False, acyclic="cuts"))]:
        res = run(**kw)
        rows.append((label, res.stats["cost"], res.stats["seconds"], proof(res)))
    rows.append(("final (default ilp)", final.stats["cost"], final.stats["seconds"],
                 f"found at {found_at(final):.1f} s; {proof(final)}"))
    return rows


def _gap(cost, opt):
    if opt is None:
        return ""
    if cost < opt * (1 - 1e-6):
        return "BELOW OPTIMUM"
    return f"{max(0.0, (cost - opt) / opt):.2%}"  # REFERENCE.md rounds optima to ~7 digits


def _table(cols, rows):
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for cells in rows:
        print("| " + " | ".join(str(c) for c in cells) + " |", flush=True)


def main(argv) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--acyclic", default="order", choices=["order", "cuts"])
    ap.add_argument("--steps", action="store_true", help="per-step table of the ILP extractor (see the doc)")
    ap.add_argument("only", nargs="*", help="substrings of e-graph paths to run")
    args = ap.parse_args(argv)
    bench = BENCH.resolve()
    if not bench.is_dir():
        print(f"no benchmark e-graphs: {bench} is absent; nothing to do")
        return 0
    optima = known_optima(bench)
    only = args.only or (["tensat/"] if args.steps else [])
    files = sorted(p for p in bench.rglob("*.json") if not only or any(s in str(p) for s in only))
    bad = False
    if args.steps:
        _table(["e-graph", "step", "cost", "gap to optimum", "s", "note"], [])
        for path in files:
            rel = str(path.relative_to(bench))
            if rel not in optima:
                continue
            rows = [(rel, name, f"{cost:.6g}", _gap(cost, optima[rel]), f"{s:.2f}", note)
                    for name, cost, s, note in steps(path, args.time_limit)]
            bad |= any(r[3] == "BELOW OPTIMUM" for r in rows)
            for r in rows:
                print("| " + " | ".join(str(c) for c in r) + " |", flush=True)
        return 1 if bad else 0
    cols = ["e-graph", "nodes", "classes", "tree", "s", "greedy-dag", "s", "ilp", "s", "found (s)", "ilp proof",
            "optimum", "tree gap", "greedy gap", "ilp gap"]
    _table(cols, [])
    for path in files:
        rel = str(path.relative_to(bench))
        r = measure(path, args.time_limit, args.acyclic)
        opt = optima.get(rel)
        proof = "optimal" if r["optimal"] else (f"gap {r['gap']:.2%}" if r["gap"] is not None else "no bound")
        gaps = [_gap(r[m], opt) for m in ("tree", "greedy-dag", "ilp")]
        bad |= "BELOW OPTIMUM" in gaps
        cells = [rel, r["nodes"], r["classes"], f"{r['tree']:.6g}", f"{r['tree_s']:.2f}",
                 f"{r['greedy-dag']:.6g}", f"{r['greedy-dag_s']:.2f}", f"{r['ilp']:.6g}", f"{r['ilp_s']:.2f}",
                 f"{r['found']:.2f}", proof, "" if opt is None else f"{opt:.6g}", *gaps]
        print("| " + " | ".join(str(c) for c in cells) + " |", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
