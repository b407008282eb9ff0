"""The `merge` rules (apsat/rules/merge.egg): sibling products become slices of one wider
product. Per rule: it fires where its members are, every member of every rewritten class
equals the original on seeded inputs (the harness's rtol 1e-4 / atol 1e-5), and it
refuses products whose weights are not known at load or that read different inputs."""
import numpy as np

import apsat
from apsat.lang.evaluate import evaluate
from harness import ATOL, RTOL, fired, members, random_tensors, run_rule

X = "(access (access-tensor x) 1)"
SHAPES = {"x": (5, 6), "w1": (3, 6), "w2": (4, 6), "w3": (2, 6), "c1": (3,), "c2": (4,), "c3": (2,),
          "x2": (5, 6)}
WEIGHTS = ("w1", "w2", "w3", "c1", "c2", "c3")
MEMBERS = ("merge/member-biased", "merge/member-unbiased", "merge/member-act", "merge/next", "merge/next-act")


def rows(name):
    return f"(access (access-tensor {name}) 1)"


def fdb(i, x=X):
    return f"(fused-dot-bias {x} {rows(f'w{i}')} {rows(f'c{i}')})"


def fdba(i, act="relu"):
    return f"(fused-dot-bias-act {act} {X} {rows(f'w{i}')} {rows(f'c{i}')})"


def dot(i, x=X):
    return f"(compute dot-product (access-cartesian-product {x} {rows(f'w{i}')}))"


def cat(*terms):
    out = terms[0]
    for t in terms[1:]:
        out = f"(access-concatenate {out} {t} 1)"
    return out


def _run(rule, products, helpers=MEMBERS, weights=WEIGHTS, **limits):
    text = cat(*products)
    eg, root, report = run_rule(rule, text, SHAPES, helpers=helpers, weights=weights, **limits)
    return eg, report, [apsat.parse(p, SHAPES).outputs["out"] for p in products]


def _sound(eg, terms) -> int:
    """Every sampled member of each product's class equals the product; returns how many
    members were compared."""
    tensors = random_tensors(SHAPES, seed=11)
    compared = 0
    for term in terms:
        want = evaluate(apsat.Program({"out": term}, SHAPES), tensors)
        for member in members(eg, eg.handle_of(term)):
            np.testing.assert_allclose(evaluate(member, tensors), want, rtol=RTOL, atol=ATOL)
            compared += 1
    return compared


def _merged(kind, indices, act=None):
    """The merged product over members `indices`, as merge.egg writes it."""
    w = rows(f"w{indices[0]}")
    c = rows(f"c{indices[0]}")
    for i in indices[1:]:
        w = f"(access-concatenate {w} {rows(f'w{i}')} 0)"
        c = f"(access-concatenate {c} {rows(f'c{i}')} 0)"
    return f"({kind} {act} {X} {w} {c})" if act else f"({kind} {X} {w} {c})"


def test_pair_makes_two_biased_products_slices_of_one():
    eg, report, (p1, p2) = _run("merge/pair", [fdb(1), fdb(2)])
    assert fired(report, "merge/pair") and fired(report, "merge/member-biased")
    m = _merged("fused-dot-bias", [1, 2])
    assert eg.matches(f"(access-slice {m} 1 0 3)", eg.handle_of(p1))
    assert eg.matches(f"(access-slice {m} 1 3 7)", eg.handle_of(p2))
    assert _sound(eg, [p1, p2]) >= 4


def test_unbiased_products_join_with_a_zero_bias():
    eg, report, (p1, p2) = _run("merge/pair", [dot(1), dot(2)])
    assert fired(report, "merge/pair") and fired(report, "merge/member-unbiased")
    assert eg.matches("(access-slice (fused-dot-bias ?x (access-concatenate ?w1 ?w2 0) ?c) 1 0 3)",
                      eg.handle_of(p1))
    assert _sound(eg, [p1, p2]) >= 4


def test_grow_adds_a_third_member_in_weight_order():
    eg, report, (p1, p2, p3) = _run("merge/grow", [fdb(1), fdb(2), fdb(3)], helpers=MEMBERS + ("merge/pair",))
    assert fired(report, "merge/grow")
    wide = _merged("fused-dot-bias", [1, 2, 3])
    assert eg.matches(f"(access-slice {wide} 1 7 9)", eg.handle_of(p3))
    # each run of adjacent members once, in weight order: {1,2}, {2,3} and {1,2,3}; never
    # {2,1}, and not {1,3}, which skips a member between them
    assert not eg.matches(f"(access-slice {_merged('fused-dot-bias', [2, 1])} 1 4 7)", eg.handle_of(p1))
    assert eg.matches(f"(access-slice {_merged('fused-dot-bias', [2, 3])} 1 0 4)", eg.handle_of(p2))
    assert not eg.matches(f"(access-slice {_merged('fused-dot-bias', [1, 3])} 1 0 3)", eg.handle_of(p1))
    assert _sound(eg, [p1, p2, p3]) >= 6


def test_pair_act_keeps_the_shared_activation_in_the_atom():
    eg, report, (p1, p2) = _run("merge/pair-act", [fdba(1), fdba(2)])
    assert fired(report, "merge/pair-act") and fired(report, "merge/member-act")
    m = _merged("fused-dot-bias-act", [1, 2], act="relu")
    assert eg.matches(f"(access-slice {m} 1 3 7)", eg.handle_of(p2))
    assert _sound(eg, [p1, p2]) >= 4


def test_grow_act_adds_a_third_member_with_the_same_activation():
    eg, report, (p1, p2, p3) = _run("merge/grow-act", [fdba(1), fdba(2), fdba(3)],
                                    helpers=MEMBERS + ("merge/pair-act",))
    assert fired(report, "merge/grow-act")
    wide = _merged("fused-dot-bias-act", [1, 2, 3], act="relu")
    assert eg.matches(f"(access-slice {wide} 1 7 9)", eg.handle_of(p3))
    assert _sound(eg, [p1, p2, p3]) >= 6


def test_different_activations_do_not_share_an_atom():
    _, report, _ = _run("merge/pair-act", [fdba(1, "relu"), fdba(2, "sigmoid")])
    assert fired(report, "merge/member-act") and not fired(report, "merge/pair-act")


def test_products_whose_weights_are_inputs_are_not_members():
    """w1, w2 not known at load (graph inputs): a product could depend on its sibling."""
    _, report, _ = _run("merge/pair", [fdb(1), fdb(2)], weights=())
    assert not any(fired(report, r) for r in MEMBERS + ("merge/pair",))


def test_products_of_different_inputs_do_not_merge():
    _, report, _ = _run("merge/pair", [fdb(1), fdb(2, x="(access (access-tensor x2) 1)")])
    assert fired(report, "merge/member-biased") and not fired(report, "merge/pair")


def test_slice_slice_is_one_slice():
    text = "(access-slice (access-slice (access (access-tensor x) 1) 1 1 5) 1 2 4)"
    eg, root, report = run_rule("merge/slice-slice", text, SHAPES)
    assert fired(report, "merge/slice-slice")
    assert eg.matches("(access-slice (access (access-tensor x) 1) 1 3 5)", root)
    tensors = random_tensors(SHAPES, seed=3)
    want = evaluate(apsat.parse(text, SHAPES), tensors)
    progs = members(eg, root)
    assert len(progs) == 2
    for prog in progs:
        np.testing.assert_array_equal(evaluate(prog, tensors), want)


def test_many_siblings_merge_in_runs_not_subsets():
    """12 products over one input (a mixture's experts): runs of adjacent members, 2 to 8
    long, are 11 + 10 + ... + 5 = 56 merged products (every subset of at most 8 would be
    3,797); the eighth member is a slice of the run of the first eight."""
    n = 12
    shapes = {"x": (5, 6), **{f"w{i}": (2, 6) for i in range(1, n + 1)}, **{f"c{i}": (2,) for i in range(1, n + 1)}}
    weights = tuple(f"{k}{i}" for k in "wc" for i in range(1, n + 1))
    text = cat(*[fdb(i) for i in range(1, n + 1)])
    rules = MEMBERS + ("merge/pair",)
    eg, _, report = run_rule("merge/grow", text, shapes, helpers=rules, weights=weights, iter_limit=9)
    nodes = eg.serialize()["nodes"].values()
    products = sum(1 for node in nodes if node["op"] == "fused-dot-bias")
    assert products == n + sum(n - k + 1 for k in range(2, 9))     # the members, then runs of 2 to 8
    assert not eg.matches(f"(access-slice {_merged('fused-dot-bias', [1, 3])} 1 0 2)", eg.handle_of(
        apsat.parse(fdb(1), shapes).outputs["out"]))
    eighth = apsat.parse(fdb(8), shapes).outputs["out"]
    assert eg.matches(f"(access-slice {_merged('fused-dot-bias', list(range(1, 9)))} 1 14 16)", eg.handle_of(eighth))
