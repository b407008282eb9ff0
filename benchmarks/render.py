"""How long drawing the neighbourhood of one e-class takes on a model-sized e-graph.

Builds the e-graph of light ResNet-50 saturated with the gpu plan (about 4–5 thousand
e-nodes) or, with --nodes N, a synthetic chain of about N e-nodes, then times
`apsat.explore.view(eg, root, depth)` (serialise, pick the neighbourhood, write DOT) and
Graphviz's SVG rendering separately, for a few depths. Aim: under a second.

Usage: python benchmarks/render.py [--nodes N] [--depths 1 2 3 4]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # run from a checkout


def resnet_egraph():
    import onnx

    import apsat
    from apsat.pipeline.zoo import light_model_paths, randomize_weights

    path = next(p for p in light_model_paths() if "resnet50" in p.name)
    model = apsat.load_onnx(randomize_weights(onnx.load(str(path))))
    eg = apsat.EGraph("gpu")
    handles = eg.add_outputs(model.program)
    eg.saturate()
    return eg, next(iter(handles.values())), "light resnet50, gpu plan"


def chain_egraph(n: int):
    import apsat

    text = "(access-tensor x)"
    for i in range(n // 2):
        text = f"(compute relu (access {text} 1))" if i % 2 else f"(compute negative (access {text} 1))"
    eg = apsat.EGraph("gpu")
    return eg, eg.add(apsat.parse(text, {"x": (4, 4)})), f"chain of {n} e-nodes"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=None, help="synthetic chain of about N e-nodes instead of ResNet-50")
    ap.add_argument("--depths", type=int, nargs="+", default=[1, 2, 3, 4])
    args = ap.parse_args(argv)
    from apsat.explore import render, view

    eg, root, what = chain_egraph(args.nodes) if args.nodes else resnet_egraph()
    nodes, classes = eg.size()
    print(f"{what}: {nodes} e-nodes, {classes} e-classes (2 cores, 24 GiB, no GPU)")
    print(f"{'depth':>5} {'classes drawn':>13} {'view + DOT s':>12} {'SVG (dot) s':>11} {'total s':>8}")
    for depth in args.depths:
        t = time.perf_counter()
        v = view(eg, root, depth=depth)
        dot_text = v.dot()
        t_view = time.perf_counter() - t
        t = time.perf_counter()
        if render.dot_available():
            render.svg(dot_text)
        t_svg = time.perf_counter() - t
        print(f"{depth:>5} {len(v.drawing.classes):>13} {t_view:>12.3f} {t_svg:>11.3f} {t_view + t_svg:>8.3f}")
    if not render.dot_available():
        print("Graphviz `dot` is not installed: SVG times are 0 (text fallback)")


if __name__ == "__main__":
    main()
