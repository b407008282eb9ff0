"""Drawing e-graphs: what the SVG and text name, the neighbourhood's depth, the fallback
without Graphviz, and the step / e-class / comparison views."""
import html
import re

import pytest

import apsat
from apsat.explore import compare, eclass, render, step, view

CONV = ("(compute dot-product (access-cartesian-product (access (access-tensor w) 1) "
        "(access-squeeze (access-windows (access (access-tensor t) 0) (shape 3 3 3) (shape 1 1 1)) 0)))")
SHAPES = {"t": (3, 32, 32), "w": (8, 3, 3, 3)}
needs_dot = pytest.mark.skipif(not render.dot_available(), reason="Graphviz `dot` is not installed")


def _conv_egraph(target="systolic"):
    eg = apsat.EGraph(target)
    return eg, eg.add(apsat.parse(CONV, SHAPES))


def _depths(drawing):
    """Class id -> child steps from the root, over the whole graph."""
    from apsat.extract.decode import expr_child_classes

    g, out, frontier = drawing.graph, {drawing.roots[0]: 0}, [drawing.roots[0]]
    while frontier:
        nxt = []
        for c in frontier:
            for nid in render.expr_members(g, c):
                for k in expr_child_classes(g, nid):
                    if k not in out:
                        out[k] = out[c] + 1
                        nxt.append(k)
        frontier = nxt
    return out


@needs_dot
def test_svg_names_every_eclass_and_enode():
    eg, root = _conv_egraph()
    v = view(eg, root, depth=None)
    svg = html.unescape(v.svg())     # Graphviz writes '-' as &#45;
    assert svg.lstrip().startswith("<?xml") or "<svg" in svg
    for cls in v.drawing.classes:
        assert cls in svg, f"e-class {cls} missing from the SVG"
    for label in ["compute dot-product", "access-cartesian-product", "access-windows", "access-tensor w",
                  "access-tensor t", "access-squeeze"]:
        assert label in svg
    assert "(8, 30, 30 | )" in svg      # the root's shape, in its label
    assert 'stroke="#d62728"' in svg    # the root highlighted


def test_neighbourhood_respects_its_depth():
    eg, root = _conv_egraph()
    eg.saturate(["im2col", "systolic"])
    whole = render.neighbourhood(eg, root, depth=None, max_classes=10_000)
    depth_of = _depths(whole)
    for depth in (0, 1, 2, 3):
        d = render.neighbourhood(eg, root, depth=depth, max_classes=10_000)
        assert set(d.classes) == {c for c, k in depth_of.items() if k <= depth}
        assert d.beyond_depth == any(k > depth for k in depth_of.values())
    text = str(view(eg, root, depth=1))
    assert text.count("e-class ") == sum(1 for k in depth_of.values() if k <= 1)


def test_max_classes_cuts_and_says_so():
    eg, root = _conv_egraph()
    eg.saturate(["im2col", "systolic"])
    d = render.neighbourhood(eg, root, depth=None, max_classes=5)
    assert len(d.classes) == 5 and d.cut > 0
    assert f"{d.cut} more e-classes" in render.egraph_dot(d)
    assert f"{d.cut} more e-classes" in render.text_drawing(d)


def test_without_graphviz_the_view_falls_back_to_text_and_says_why(monkeypatch):
    eg, root = _conv_egraph()
    monkeypatch.setattr(render.shutil, "which", lambda name: None)
    v = view(eg, root, depth=1)
    page = v._repr_html_()
    assert "Graphviz `dot` is not installed" in page and "e-class" in page
    assert v._repr_svg_() is None
    with pytest.raises(RuntimeError, match="not installed"):
        v.svg()


def test_negative_depth_is_refused():
    eg, root = _conv_egraph()
    with pytest.raises(ValueError, match="depth must be >= 0"):
        view(eg, root, depth=-1)


def test_step_reports_growth_and_rules():
    eg, root = _conv_egraph()
    first = step(eg, "im2col")
    assert first.after[0] > first.before[0]
    assert any(rule.startswith("im2col/") for rule, _ in first.rows())
    second = step(eg, "systolic")
    assert second.before == first.after
    assert "systolic/dot-product-to-systolic-array" in dict(second.rows())
    assert "systolic" in second._repr_html_() and "&rarr;" in second._repr_html_()


def test_eclass_lists_members_with_shapes_and_costs():
    eg, root = _conv_egraph()
    step(eg, "im2col")
    info = eclass(eg, root)
    labels = [label for label, _, _ in info.members]
    assert "compute dot-product ·" in labels and any(lab.startswith("access-reshape") for lab in labels)
    assert info.shape == ((8, 30, 30), ())
    assert info.cost_model == "systolic"
    costs = {label: c for label, c, _ in info.members}
    assert costs["compute dot-product ·"] > 0        # a dot-product left to the host
    made = {label: by for label, _, by in info.members}
    assert made["compute dot-product ·"] == "import"   # the convolution as imported
    assert all(by == "im2col" or by.startswith("im2col/") for label, by in made.items() if label.startswith("access-reshape"))
    assert re.search(r"access-reshape", info._repr_html_())


def test_chain_operators_are_labelled_with_their_parts():
    eg = apsat.EGraph("gpu")
    text = ("(compute sigmoid (compute relu (compute elementwise-add "
            "(access-pair (access (access-tensor x) 1) (access (access-tensor x) 1)))))")
    root = eg.add(apsat.parse(text, {"x": (4, 5)}))
    step(eg, "fusion")
    labels = [label for label, _, _ in eclass(eg, root).members]
    assert "compute (chain (chain elementwise-add relu) sigmoid) ·" in labels
    assert "compute sigmoid ·" in labels and "compute (chain relu sigmoid) ·" in labels


def test_compare_puts_extractions_side_by_side_and_marks_differences():
    eg, root = _conv_egraph()
    eg.saturate(["im2col", "systolic"])
    c = compare(eg, root, methods=("tree", "greedy-dag"), costs=("nodes", "systolic"))
    assert set(c.programs) == {"tree/nodes", "greedy-dag/nodes", "tree/systolic", "greedy-dag/systolic"}
    assert "systolic-array" in c.programs["greedy-dag/systolic"].op_counts()
    assert "systolic-array" not in c.programs["tree/nodes"].op_counts()
    page = c._repr_html_()
    assert "background:#fff3b0" in page        # lines the first program lacks
    assert "+" in c.diff("tree/nodes", "greedy-dag/systolic")


def test_saturate_plan_steps_every_phase_with_a_progress_display(capsys):
    from apsat.explore import saturate_plan
    from apsat.rules.saturate import default_plan

    eg, root = _conv_egraph()
    report = saturate_plan(eg)
    assert [s.name for s in report.steps] == [p.name for p in default_plan(eg.target)]
    assert report.steps[-1].after == eg.size()
    assert "systolic-array" in apsat.extract(eg, root).op_counts()
    out = capsys.readouterr()
    assert "phases" in out.out + out.err          # the progress bar was drawn
    assert "<table>" in report._repr_html_() and "im2col" in str(report)
