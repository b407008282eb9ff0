"""Interactive exploration: objects that show themselves in Jupyter.

    view(eg, root, depth)     EGraphView: the e-graph (or one e-class's neighbourhood) as SVG
    step(eg, name)            StepReport: run one phase or ruleset, show what changed
    saturate_plan(eg)         PlanReport: the whole default plan with a progress display
    eclass(eg, handle)        EClassInfo: one e-class's members, their shapes and costs
    compare(eg, root, ...)    Comparison: extractions side by side, differences marked

Each object has `_repr_html_` for notebooks and a readable `__str__` for terminals. The
apsat.EGraph methods of the same names (apsat/explore/egraph.py) call these.
"""
from __future__ import annotations

import difflib
import html
import time
from dataclasses import dataclass, field

from apsat.explore import render


@dataclass(repr=False)
class EGraphView:
    """A drawing of `eg` around `root` to `depth` child steps (see render.neighbourhood).
    Renders as SVG through Graphviz; without `dot`, as text, and says why."""

    drawing: render.Drawing
    fallback_reason: str = ""

    def dot(self) -> str:
        """The Graphviz DOT source."""
        return render.egraph_dot(self.drawing)

    def svg(self) -> str:
        """SVG text (RuntimeError when Graphviz is missing)."""
        return render.svg(self.dot())

    def _repr_svg_(self):
        if not render.dot_available():
            return None   # Jupyter then uses _repr_html_'s text fallback
        return self.svg()

    def _repr_html_(self) -> str:
        if render.dot_available():
            return f'<div style="overflow:auto">{self.svg()}</div>'
        why = "Graphviz `dot` is not installed (Debian: apt-get install graphviz); showing text"
        return f"<p><i>{html.escape(why)}</i></p><pre>{html.escape(str(self))}</pre>"

    def __str__(self) -> str:
        return render.text_drawing(self.drawing)

    def __repr__(self) -> str:
        return f"<EGraphView {len(self.drawing.classes)} e-classes, roots {self.drawing.roots}>"


def view(eg, root=None, depth: int | None = 2, max_classes: int = render.MAX_CLASSES) -> EGraphView:
    """The neighbourhood of `root` (a handle; None: all outputs) to `depth` child steps
    (None: unbounded), at most `max_classes` e-classes."""
    return EGraphView(render.neighbourhood(eg, root, depth, max_classes))


@dataclass(repr=False)
class StepReport:
    """What one step did: e-graph size before and after, matches per rule, stop reason."""

    name: str
    rulesets: list
    before: tuple
    after: tuple
    seconds: float
    stop_reason: str
    rule_matches: dict = field(default_factory=dict)

    def __repr__(self) -> str:
        return str(self).splitlines()[0]

    def rows(self) -> list[tuple[str, int]]:
        """(rule, matches) for the rules that matched, most first."""
        return sorted(((r, n) for r, n in self.rule_matches.items() if n), key=lambda x: -x[1])

    def __str__(self) -> str:
        head = (f"{self.name}: e-nodes {self.before[0]} -> {self.after[0]}, e-classes {self.before[1]} -> "
                f"{self.after[1]}, {self.seconds:.2f} s, stopped: {self.stop_reason}")
        return "\n".join([head] + [f"  {n:6d}  {r}" for r, n in self.rows()])

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><td>{html.escape(r)}</td><td style='text-align:right'>{n}</td></tr>" for r, n in self.rows())
        return (f"<b>{html.escape(self.name)}</b> ({', '.join(map(html.escape, self.rulesets))}): "
                f"e-nodes {self.before[0]} &rarr; <b>{self.after[0]}</b>, e-classes {self.before[1]} &rarr; "
                f"<b>{self.after[1]}</b>, {self.seconds:.2f} s, stopped: {html.escape(self.stop_reason)}"
                f"<table><tr><th>rule</th><th>matches</th></tr>{rows}</table>")


def step(eg, name: str, **limits) -> StepReport:
    """Run one phase of the target's default plan (by phase name: "layout", "im2col", ...)
    or one ruleset (by name) and report what changed. `limits` (iter_limit, node_limit,
    time_limit) override the phase's own."""
    from apsat.rules.saturate import Phase, default_plan, saturate

    phase = next((p for p in default_plan(eg.target) if p.name == name), None) or Phase(name, (name,))
    settings = {"iter_limit": phase.iter_limit, "node_limit": phase.node_limit, "time_limit": phase.time_limit}
    settings.update(limits)
    before = eg.size()
    start = time.perf_counter()
    report = saturate(eg, list(phase.rulesets), **settings)
    run = report["phases"][0] if report["phases"] else {"stop_reason": "skipped", "rule_matches": {}}
    return StepReport(name, list(phase.rulesets), before, eg.size(), time.perf_counter() - start,
                      run["stop_reason"], dict(run["rule_matches"]))


@dataclass(repr=False)
class PlanReport:
    """One StepReport per phase of a plan run by `saturate_plan`."""

    steps: list

    def __str__(self) -> str:
        return "\n".join(str(s).splitlines()[0] for s in self.steps)

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><td>{html.escape(s.name)}</td><td>{s.before[0]}</td><td>{s.after[0]}</td>"
                       f"<td>{s.after[1]}</td><td>{s.seconds:.2f}</td><td>{html.escape(s.stop_reason)}</td></tr>"
                       for s in self.steps)
        return ("<table><tr><th>phase</th><th>e-nodes before</th><th>after</th><th>e-classes</th>"
                f"<th>seconds</th><th>stopped</th></tr>{rows}</table>")


def saturate_plan(eg, progress: bool = True, **limits) -> PlanReport:
    """Run the target's default plan one phase at a time, showing a progress display (a
    bar over the phases naming the current one and the e-graph size; rich renders it in
    a terminal and in Jupyter) unless `progress` is False."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from apsat.rules.saturate import default_plan

    plan = default_plan(eg.target)
    steps = []
    columns = (TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} phases"),
               TimeElapsedColumn())
    with Progress(*columns, disable=not progress, transient=False) as bar:
        task = bar.add_task("saturating", total=len(plan))
        for phase in plan:
            bar.update(task, description=f"phase {phase.name} ({eg.size()[0]} e-nodes)")
            steps.append(step(eg, phase.name, **limits))
            bar.advance(task)
        bar.update(task, description=f"done ({eg.size()[0]} e-nodes)")
    return PlanReport(steps)


@dataclass(repr=False)
class EClassInfo:
    """The members of one e-class: label, shape and cost under `cost_model` (the node's
    own cost, children not included)."""

    cls: str
    shape: object
    cost_model: str
    members: list   # (label, cost, made by: "import", a rule's name, or None: no rule explains it)

    def __str__(self) -> str:
        lines = [f"e-class {self.cls} {render.shape_text(self.shape)} ({self.cost_model} cost)"]
        return "\n".join(lines + [f"  {c:12.4g}  {label}  [{by or '?'}]" for label, c, by in self.members])

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><td><code>{html.escape(label)}</code></td><td style='text-align:right'>{c:.4g}</td>"
                       f"<td>{html.escape(by or '?')}</td></tr>" for label, c, by in self.members)
        return (f"<b>e-class {html.escape(self.cls)}</b> shape {html.escape(render.shape_text(self.shape))}"
                f"<table><tr><th>e-node</th><th>own cost ({html.escape(self.cost_model)})</th>"
                f"<th>made by</th></tr>{rows}</table>")


def eclass(eg, handle, cost=None) -> EClassInfo:
    """Members of `handle`'s e-class with their shapes, own costs (cost model `cost`,
    default the e-graph target's) and what made each: the import, the rule whose right side
    it is (apsat.pipeline.trace.built_by), or "?" when no rule explains it."""
    from apsat.extract.cost import cost_model
    from apsat.pipeline.trace import built_by
    from apsat.rules.library import RuleLibrary

    drawing = render.neighbourhood(eg, handle, depth=0)
    graph, cls = drawing.graph, drawing.roots[0]
    graph.shapes = drawing.shapes
    model = cost_model(cost, eg.target)
    price = model.node_cost(graph)
    nids = render.expr_members(graph, cls)
    made = built_by(eg, getattr(eg, "added_terms", ()), graph, nids, getattr(eg, "library", None) or RuleLibrary())
    members = [(render.node_label(graph, nid), price(nid), made[nid]) for nid in nids]
    return EClassInfo(cls, drawing.shapes.get(cls), model.name, sorted(members, key=lambda m: m[1]))


@dataclass(repr=False)
class Comparison:
    """Extractions of one e-graph side by side: name -> Program (with .cost, .extraction)."""

    programs: dict

    def __repr__(self) -> str:
        return str(self)

    def texts(self) -> dict[str, list[str]]:
        """name -> the program's DAG text lines."""
        from apsat.lang.syntax import to_dag_text

        return {name: to_dag_text(p.outputs).splitlines() for name, p in self.programs.items()}

    def __str__(self) -> str:
        rows = [f"{name:>14}: cost {p.cost:.6g}  ({p.extraction.get('cost_model')}, "
                f"{p.extraction.get('seconds', 0):.3f} s, {len(p.terms())} nodes)" for name, p in self.programs.items()]
        return "\n".join(rows)

    def _repr_html_(self) -> str:
        texts = self.texts()
        names = list(self.programs)
        base = set(texts[names[0]])
        cells = []
        for name in names:
            p = self.programs[name]
            lines = "".join((f"<div style='background:#fff3b0'>{html.escape(line)}</div>" if line not in base
                             else f"<div>{html.escape(line)}</div>") for line in texts[name])
            cells.append(f"<td style='vertical-align:top'><b>{html.escape(name)}</b><br>cost {p.cost:.6g} "
                         f"({html.escape(str(p.extraction.get('cost_model')))})<pre style='font-size:85%'>{lines}</pre></td>")
        return ("<p>Lines not in the first program are highlighted.</p>"
                f"<table><tr>{''.join(cells)}</tr></table>")

    def diff(self, a: str, b: str) -> str:
        """A unified diff of two programs' DAG texts."""
        t = self.texts()
        return "\n".join(difflib.unified_diff(t[a], t[b], a, b, lineterm=""))


def compare(eg, root=None, methods=("tree", "greedy-dag", "ilp"), costs=(None,), time_limit: float = 10.0) -> Comparison:
    """Extract `root` (a handle, a dict of handles, or None: every output) with each
    method under each cost model (None: the target's) and put the results side by side."""
    from apsat.extract import extract

    root = root if root is not None else dict(eg.outputs)
    programs = {}
    for cost in costs:
        for method in methods:
            name = method if len(costs) == 1 else f"{method}/{cost or eg.target.kind}"
            programs[name] = extract(eg, root, method=method, cost=cost, time_limit=time_limit)
    return Comparison(programs)
