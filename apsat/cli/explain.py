"""`apsat explain OUT_DIR`: the why-trace of an optimised model, as a tree per atom.

OUT_DIR is what `apsat optimize --out` wrote for one model (it holds report.json) or the
`--out` of `optimize`/`zoo` (each model's directory under it is explained in turn). For each
atom of the chosen program that rewrites built, the tree shows the node, the rule that made
it (`<- RULE`) and, under it, the nodes that rule's left side used that rules made first.
A report written before apsat recorded the why-trace, or none at all, is a one-line error.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from apsat.errors import ApsatError

EXIT_OK = 0


def explain_options(p) -> None:
    """The `explain` sub-command's arguments."""
    p.add_argument("out_dir", help="a model's output directory (holding report.json) or an --out directory")
    p.add_argument("--rule", metavar="NAME", help="only the atoms this rule helped build")
    p.add_argument("--limit", type=int, default=50, metavar="N", help="atoms shown per model (default 50; 0: all)")


def cmd_explain(args) -> int:
    """Print the why-trace of each report under `args.out_dir` (module doc)."""
    args.phase = "explain"
    for name, report in _reports(Path(args.out_dir)):
        print("\n".join(explain_lines(name, report, args.rule, args.limit)))
    return EXIT_OK


def _reports(path: Path) -> list[tuple[str, dict]]:
    """(model name, report) for `path`'s report.json or its model directories' reports."""
    if not path.is_dir():
        raise ApsatError(f"{path}: no such output directory")
    files = [path / "report.json"] if (path / "report.json").is_file() else sorted(path.glob("*/report.json"))
    if not files:
        raise ApsatError(f"{path}: no report.json here or in a model directory under it")
    out = []
    for file in files:
        try:
            report = json.loads(file.read_text())
        except (OSError, ValueError) as exc:
            raise ApsatError(f"{file}: cannot read the report ({exc.__class__.__name__})") from None
        if not isinstance(report, dict) or "why" not in report:
            raise ApsatError(f"{file}: the report has no why-trace (written by an older apsat: optimise again)")
        out.append((file.parent.name, report))
    return out


def explain_lines(name: str, report: dict, rule: str | None = None, limit: int = 50) -> list[str]:
    """The why-trace of one report as text lines: a header with the rules used (how many
    atoms each helped build), then each atom's tree."""
    atoms = report["why"].get("atoms", [])
    if rule:
        atoms = [a for a in atoms if rule in a["rules"]]
    used = Counter(r for a in atoms for r in a["rules"])
    lines = [f"{name}: {len(atoms)} atom(s) built by rewrites" + (f" with {rule}" if rule else "")]
    if report["why"].get("left_out"):
        lines[0] += f" ({report['why']['left_out']} more not recorded)"
    if used:
        lines.append("  rules: " + ", ".join(f"{r} x{n}" for r, n in used.most_common()))
    shown = atoms if limit <= 0 else atoms[:limit]
    for atom in shown:
        lines.append(f"  e-class {atom['class']}")
        lines.extend(_tree_lines(atom["tree"], "    ", ""))
    if len(shown) < len(atoms):
        lines.append(f"  ... {len(atoms) - len(shown)} more (--limit 0 shows all)")
    return lines


def _tree_lines(tree: dict, indent: str, branch: str) -> list[str]:
    by = f"  <- {tree['rule']}" if tree["rule"] else "  (no rule's pattern explains it)"
    out = [f"{indent}{branch}{tree['node']}{by}"]
    kids = tree["from"]
    deeper = indent + ("   " if branch == "`- " else "|  " if branch else "")
    for i, child in enumerate(kids):
        out.extend(_tree_lines(child, deeper, "`- " if i == len(kids) - 1 else "|- "))
    return out
