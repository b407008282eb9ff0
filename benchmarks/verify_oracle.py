"""Verification's float64 rule over the zoo: per model and target, apsat's float32 error and
onnxruntime's against a float64 run of the original model (scaled by the output's
max |value|), their ratio, the oracle, the rule's verdict and the old fixed-tolerance
verdict (rtol 1e-4, atol 1e-5 x scale against float32 onnxruntime); on systolic targets
the simulator's ratio too. Then planted wrong rewrites, which must fail: one sign flipped
(a deep conv or matmul wrapped in `compute negative`) and one bias dropped (one use of a
bias read as zeros), on ResNet-50 (light zoo) and BERT-base (benchmarks/gpu_models.py).

Models: the light zoo (seeded weights, logits compared: as tests/test_pipeline.py), the
real zoo on its stored inputs, and torchvision's Inception-v3 at 299x299 (seeded weights,
BatchNorm statistics from a forward pass over 4 seeded images, exported at opset 17 into
the user cache; needs torch and torchvision: benchmarks/export_zoo.py's INSTALL line).
Each model and target runs in its own process.

Columns: s is the whole run (optimise, oracle, judging), oracle s the oracle alone
(onnxruntime in float32 and on the float64 copy), both in the model's fresh process.

Usage: python benchmarks/verify_oracle.py [NAME_SUBSTRING ...] [--targets gpu,systolic:32x32]
       [--no-planted] [--json FILE] [--table FILE]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
TARGETS = ("gpu", "systolic:32x32")
PLANTED = ("light_resnet50", "bert_base")
HEAVY = {"fused-dot-bias", "fused-dot-bias-act", "attention", "systolic-array"}
# A planted change must move an output by more than this (of its scale) on the inputs to
# count as wrong; the planting helpers try up to MAX_TRIES sites to find one that does.
EFFECT, MAX_TRIES = 1e-5, 12
BIAS = re.compile(r"bias|_b(_\d+)?$")
INCEPTION = "inception_v3_299"


# ---- models ---------------------------------------------------------------------------------

def model_names() -> list[str]:
    from real_zoo import zoo_models

    from apsat.pipeline.zoo import light_model_paths

    return [p.stem for p in light_model_paths()] + [m["name"] for m in zoo_models()] + [INCEPTION]


def load(name: str):
    """(ModelProto, inputs or None for seeded ones, optimize's seed) of a model."""
    import onnx

    from apsat.pipeline.zoo import light_model_paths, logits_output, randomize_weights

    light = {p.stem: p for p in light_model_paths()}
    if name in light:
        return logits_output(randomize_weights(onnx.load(str(light[name])), seed=1)), None, 2
    if name == INCEPTION:
        path = inception_v3()
        return onnx.load(str(path)), inception_input(), 0
    if name == "bert_base":
        import gpu_models

        model, inputs = gpu_models.load("bert_base")
        return model, inputs, 0
    from real_zoo import ZOO, stored_inputs

    return onnx.load(str(ZOO / f"{name}.onnx")), stored_inputs(name), 0


def inception_input():
    import numpy as np

    return {"x": np.random.default_rng(0).standard_normal((1, 3, 299, 299)).astype(np.float32)}


def inception_v3() -> Path:
    """torchvision's Inception-v3 (seeded init, BatchNorm statistics from one training-mode
    pass over 4 seeded images, eval mode) exported once into the user cache."""
    from platformdirs import user_cache_dir

    path = Path(user_cache_dir("apsat")) / f"{INCEPTION}.onnx"
    if path.is_file():
        return path
    import io

    import numpy as np
    import onnx
    import torch
    from export_zoo import _import_torchvision

    tv = _import_torchvision(torch)
    torch.manual_seed(0)
    net = tv.models.inception_v3(weights=None, aux_logits=False, init_weights=True)
    for mod in net.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.momentum = None            # a plain average over the calibration pass
    with torch.no_grad():
        net.train()(torch.from_numpy(np.random.default_rng(1).standard_normal((4, 3, 299, 299)).astype(np.float32)))
    buf = io.BytesIO()
    torch.onnx.export(net.eval(), (torch.from_numpy(inception_input()["x"]),), buf, dynamo=False,
                      opset_version=17, input_names=["x"], output_names=["logits"])
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(onnx.load_from_string(buf.getvalue()), str(path))
    return path


# ---- planted wrong rewrites -----------------------------------------------------------------

def substitute(root_terms: dict, old, new) -> dict:
    """The output terms with every use of term `old` replaced by `new` (terms are
    hash-consed: the terms above it are rebuilt)."""
    from apsat.lang.term import Term, postorder

    done = {old: new}

    def sub(a):
        if isinstance(a, Term):
            return done.get(a, a)
        return tuple(sub(b) for b in a) if isinstance(a, tuple) else a

    for t in postorder(list(root_terms.values())):
        if t is not old:
            args = tuple(sub(a) for a in t.args)
            done[t] = t if all(x is y for x, y in zip(args, t.args)) else Term(t.op, args)
    return {k: done[t] for k, t in root_terms.items()}


def _reads_input(program, inputs) -> dict:
    """Term -> whether it reads a model input (False: weights only)."""
    out = {}
    for t in program.terms():
        out[t] = (t.op == "access-tensor" and t.args[0] in inputs) or any(out[c] for c in t.children())
    return out


def _from_deep(candidates: list) -> list:
    """The candidates from 60% of the way through (children-first order) outward: deep,
    not the last layer first."""
    start = int(0.6 * (len(candidates) - 1))
    order = sorted(range(len(candidates)), key=lambda i: abs(i - start))
    return [candidates[i] for i in order[:MAX_TRIES]]


def _moves(program, weights, inputs, honest) -> bool:
    """Whether `program` moves some output by more than EFFECT of its scale from `honest`
    (a plant that does not is no wrong rewrite on these inputs: a key projection's bias,
    which softmax cancels, a matmul whose result the network then ignores)."""
    import numpy as np

    got = _run(program, weights, inputs)
    return any(np.abs(got[k] - v).max() > EFFECT * np.abs(v).max() for k, v in honest.items())


def plant_sign_flip(program, model, inputs):
    """(program with one deep conv/matmul's output negated, its op): the first of
    `_from_deep`'s heavy terms (reading model inputs) whose negation `_moves` an output."""
    from apsat.lang.program import Program
    from apsat.lang.term import Term

    live, honest = _reads_input(program, inputs), _run(program, model.weights, inputs)
    heavy = [t for t in program.terms() if live[t] and (t.op in HEAVY or (
        t.op == "compute" and t.args[0].op == "dot-product"))]
    for target in _from_deep(heavy):
        flipped = Term("compute", (Term("negative", ()), target))
        outs = substitute(program.outputs, target, flipped)
        planted = Program(outs, program.tensor_shapes, program.opaque_nodes, program.weights)
        if _moves(planted, model.weights, inputs, honest):
            return planted, target.op
    raise ValueError("no conv or matmul whose negation moves an output")


def plant_dropped_bias(program, model, inputs):
    """(program and weights with one use of one bias read as zeros, the bias's name): a
    term reading model inputs whose weights-only child reads the bias gets a zero tensor
    there, so other uses of the same (shared) bias keep it; the first of `_from_deep`'s
    such sites that `_moves` an output."""
    import numpy as np

    live, honest = _reads_input(program, inputs), _run(program, model.weights, inputs)
    names = [n for n in dict.fromkeys(program.tensor_names())
             if n in model.weights and np.ndim(model.weights[n]) == 1 and BIAS.search(n.lower())]
    sites = [(t, c, n) for t in program.terms() if live[t] for c in t.children() if not live[c]
             for read in [_tensors(c)] for n in names if n in read]
    for site, child, name in _from_deep(sites):
        planted, weights = _zero_one_use(program, model.weights, site, child, name)
        if _moves(planted, weights, inputs, honest):
            return planted, weights, name
    raise ValueError("no bias whose dropping moves an output")


def _zero_one_use(program, weights: dict, site, child, name: str):
    """(program whose `site` reads tensor `name` through `child` as zeros, weights with
    the zeros added under a new name)."""
    import numpy as np

    from apsat.lang.program import Program
    from apsat.lang.term import Term

    zero = f"{name}/dropped"
    new_child = substitute({"c": child}, Term("access-tensor", (name,)), Term("access-tensor", (zero,)))["c"]
    new_site = Term(site.op, tuple(new_child if a is child else a for a in site.args))
    outs = substitute(program.outputs, site, new_site)
    shapes = {**program.tensor_shapes, zero: program.tensor_shapes[name]}
    return (Program(outs, shapes, program.opaque_nodes, program.weights | {zero}),
            {**weights, zero: np.zeros_like(weights[name])})


def _tensors(term) -> set[str]:
    from apsat.lang.term import postorder

    return {t.args[0] for t in postorder(term) if t.op == "access-tensor"}


# ---- measuring ------------------------------------------------------------------------------

def _row(name: str, target: str, v: dict, fixed_ok: bool, **extra) -> dict:
    return {"model": name, "target": target, "err_apsat": v["err_apsat"], "err_ort": v["err_ort"],
            "ratio": v["ratio"], "oracle": v["oracle"], "ok": v["ok"], "fixed_ok": fixed_ok, **extra}


def measure(name: str, target: str, planted: bool) -> list[dict]:
    """One model on one target: its row, and the planted rows when asked."""
    from apsat.pipeline.optimize import optimize
    from apsat.pipeline.verify import compare, judge, run_oracle
    from apsat.pipeline.zoo import random_inputs

    model, inputs, seed = load(name)
    t = time.perf_counter()
    res = optimize(model, target=target, inputs=inputs, seed=seed, verify=False,
                   input_shapes={k: v.shape for k, v in inputs.items()} if inputs else None)
    m = res.model
    inputs = inputs if inputs is not None else random_inputs(m, seed)
    t_oracle = time.perf_counter()
    oracle = run_oracle(m.onnx, inputs)
    t_oracle = time.perf_counter() - t_oracle
    got = res.run(inputs)
    v = judge(oracle, got).to_dict()
    rows = [_row(name, target, v, compare({k: oracle.float32[k] for k in got}, got).ok,
                 seconds=time.perf_counter() - t, oracle_s=t_oracle, notes=v["oracle_notes"])]
    if target.startswith("systolic"):
        sim = judge(oracle, res.backend.run(res.lowered, {**m.weights, **inputs}))
        rows[0].update(sim_ratio=sim.ratio, sim_ok=sim.ok)
    if planted:
        rows += _planted_rows(name, target, res, inputs, oracle)
    return rows


def _planted_rows(name, target, res, inputs, oracle) -> list[dict]:
    """The sign flip and the dropped bias, each judged against the same oracle."""
    from types import SimpleNamespace

    from apsat.pipeline.verify import compare, verify_program

    m, rows = res.model, []
    flipped, what = plant_sign_flip(res.program, m, inputs)
    dropped, weights, bias = plant_dropped_bias(res.program, m, inputs)
    for label, program, weights_, detail in (("sign flip", flipped, m.weights, f"{what} negated"),
                                             ("bias dropped", dropped, weights, f"one use of {bias} zeroed")):
        model = SimpleNamespace(onnx=m.onnx, weights=weights_)
        v = verify_program(model, program, inputs, oracle=oracle)
        got = _run(program, weights_, inputs)
        rows.append(_row(f"  {name}: {label}", target, v.to_dict(),
                         compare({k: oracle.float32[k] for k in got}, got).ok, planted=detail))
    return rows


def _run(program, weights, inputs) -> dict:
    from apsat.lang.evaluate import evaluate

    out = evaluate(program, {**weights, **inputs})
    return out if isinstance(out, dict) else {next(iter(program.outputs)): out}


def _child(name, target, planted, queue):
    try:
        queue.put(measure(name, target, planted))
    except Exception as e:     # a refusal or a bug: that row's failure
        queue.put([{"model": name, "target": target, "error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}])


def run_isolated(name: str, target: str, planted: bool) -> list[dict]:
    """measure() in a fresh (spawned) process."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(name, target, planted, queue))
    proc.start()
    rows = queue.get()
    proc.join()
    return rows


def _num(x, fmt) -> str:
    return "-" if x is None else format(x, fmt)


def print_table(rows: list[dict]):
    from apsat.pipeline.verify import FLOOR, K

    head = (f"{'model':<44} {'target':<14} {'err_apsat':>9} {'err_ort':>9} {'ratio':>7} {'oracle':<7} "
            f"{'verdict':<7} {'fixed':<7} {'sim ratio':>9} {'s':>6} {'oracle s':>8}")
    print(f"rule: ok when err_apsat <= {K:g} x err_ort + {FLOOR:.3g} (errors scaled by max |float64 output|)")
    print(head)
    print("-" * len(head))
    for r in rows:
        if "error" in r:
            print(f"{r['model']:<44} {r['target']:<14} {r['error']}")
            continue
        oracle = "f64" if r["oracle"].startswith("float64") else "f32"
        sim = "" if "sim_ratio" not in r else (_num(r["sim_ratio"], ".2f") + ("" if r["sim_ok"] else " FAIL"))
        print(f"{r['model']:<44} {r['target']:<14} {_num(r['err_apsat'], '.2e'):>9} {_num(r['err_ort'], '.2e'):>9} "
              f"{_num(r['ratio'], '.2f'):>7} {oracle:<7} {'ok' if r['ok'] else 'FAIL':<7} "
              f"{'ok' if r['fixed_ok'] else 'FAIL':<7} {sim:>9} {_num(r.get('seconds'), '.1f'):>6} "
              f"{_num(r.get('oracle_s'), '.2f'):>8}")
    for r in rows:
        if "planted" in r:
            print(f"{r['model'].strip()} {r['planted']}")
        if "error" not in r and not r["oracle"].startswith("float64"):
            print(f"{r['model']} {r['target']}: {r['oracle']}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("filters", nargs="*", help="model name substrings (default: all)")
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--no-planted", action="store_true", help="skip the planted wrong rewrites")
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--table", metavar="JSON", help="only print the table of rows written by --json")
    args = parser.parse_args(argv)
    if args.table:
        print_table(json.loads(Path(args.table).read_text()))
        return 0
    names = [n for n in model_names() if not args.filters or any(f in n for f in args.filters)]
    planted = [] if args.no_planted else [n for n in PLANTED if not args.filters or any(f in n for f in args.filters)]
    rows = []
    for name in dict.fromkeys(names + planted):
        for target in args.targets.split(",") if name != "bert_base" else ["gpu"]:
            rows += run_isolated(name, target, name in planted and target == "gpu")
            print(f"  {name} {target}: {'error' if 'error' in rows[-1] else 'done'}", file=sys.stderr, flush=True)
    print_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=str) + "\n")
    honest = [r for r in rows if not r["model"].startswith(" ")]
    bad = [r for r in honest if "error" in r or not r["ok"]] + [r for r in rows if r["model"].startswith(" ") and r.get("ok")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
