"""Running rulesets in bursts under iteration, node and time limits (EGraph.run).

egglog cannot stop inside a `run-schedule`, so the driver runs short bursts and checks the
limits between them; near the node limit it runs single iterations whose match limit is
the room left divided by the most e-nodes one match can add (counted from the rules'
right-hand sides when they are loaded: `record_rule_sizes`). Split out of egraph.py, which
keeps the e-graph itself; these functions use its private helpers (`_run`,
`_node_count`, `_saturate_shapes`) by design.
"""
from __future__ import annotations

import math
import re
import time

from egglog import bindings

from apsat.egraph.egglog_io import language_text
from apsat.lang.ops import OPS
from apsat.errors import EGraphError

# Rules of the `shapes` ruleset (language.egg, shape_rules.egg): left out of the per-rule
# match counts.
SHAPE_RULE_NAMES = set(re.findall(r':name "([^"]+)"', language_text()))


def run(eg, rulesets, iter_limit: int = 30, node_limit: int = 100_000,
        time_limit: float = 10.0, match_limit: int = 100_000, ban_length: int = 2) -> dict:
    """Run the named rulesets (a name or a list) until saturation or a limit.

    Contract: unknown names raise EGraphError before egglog sees them. Iterations run
    in bursts, each one `run-schedule` with a fresh back-off scheduler (a rule
    matching more than the burst's match limit in an iteration applies none of
    those matches and is banned for `ban_length` iterations, doubling), one
    iteration being one step of every named ruleset and four of `shapes`. Between
    bursts shapes are saturated and checked (ShapeError on a conflict or an
    ill-shaped node) and sizes and time compared with the limits.

    Node limit: egglog cannot stop inside a burst, so the driver predicts from the
    measured per-iteration growth factor of the last burst (a doubling before any is
    measured). Far from the limit bursts double in length, cut so the prediction
    adds at most half the room left, and to one iteration once the room is below
    what the last burst added; rules may apply up to `match_limit` matches each per
    iteration. Once the next iteration is predicted to overflow, every iteration is
    single and runs under the match limit `room // B`, B = growth_per_match(the
    rulesets), so it cannot add more than the room. When such an iteration adds no
    node but changes something (a rule held back), doubled match limits are probed on
    a copy (egglog push/pop) and the first that adds nodes within the limit is
    granted for one iteration; one that overflows stops with "node_limit" (under
    the limit: what is left does not fit), one that changes nothing with
    "saturated". So a phase ends over its node limit only when an iteration far from
    it grew past the whole room: `overshoot` and `last_burst` report it (at most that
    burst's growth, a single iteration unless its prediction was off by more than 2x).

    Returns {"rulesets", "iterations", "bursts", "stop_reason" ("saturated",
    "iter_limit", "node_limit" or "time_limit"), "nodes_before", "nodes_after",
    "node_limit", "overshoot" (nodes over node_limit, 0 when under), "last_burst"
    ({"iterations", "nodes_added", "match_limit"} of the last burst run, None when
    none ran), "burst_log" ([iterations, match limit, nodes after] per burst),
    "probes" (iterations run on a copy and rolled back), "seconds", "rule_matches"
    (rule name or text -> matches, shapes rules left out)}."""
    names = [rulesets] if isinstance(rulesets, str) else list(rulesets)
    for name in names:
        if name not in eg._rulesets:
            raise EGraphError(f"unknown ruleset {name!r}; loaded: {', '.join(eg.rulesets)}")
    start = time.perf_counter()
    nodes_before = nodes = eg._node_count()
    # A few shape steps per iteration so rules guarded by shapes see new nodes; the
    # full (bounded) saturation runs between bursts.
    step = " ".join(f"(run-with bo {n})" for n in names) + " (repeat 4 (run shapes))"
    per_match = max(1, eg.growth_per_match(names))
    iterations, probes, matches, log = 0, 0, {}, []
    # Before any growth is measured, assume an iteration may double the graph.
    k, grown, factor, per_iter_s = 0, 0, 2.0, 0.0
    last, near, granted, last_grant = None, False, 0, 0
    while True:
        elapsed = time.perf_counter() - start
        if iterations >= iter_limit:
            stop = "iter_limit"
            break
        if elapsed >= time_limit:
            stop = "time_limit"
            break
        room = node_limit - nodes
        if room <= 0:
            stop = "node_limit"
            break
        # Geometric prediction from the last burst (exploratory rules multiply the
        # graph): near once the next iteration is predicted to overflow. Once near,
        # stay near: a throttled iteration's small growth says nothing about what the
        # held-back rules would add.
        near = near or room < nodes * (factor - 1.0)
        if near:
            # room // per_match: even if every rule applied that many matches, each
            # adding all its right-hand side, the iteration would fit in the room.
            k, limit = 1, min(match_limit, max(granted, room // per_match))
            if limit == 0:
                stop = "node_limit"
                break
        else:
            # Single iterations once the room is below what the last burst added.
            k = 1 if room < grown else min(2 * k or 1, iter_limit - iterations)
            if per_iter_s > 0:      # aim to land inside the time limit
                k = min(k, max(1, int((time_limit - elapsed) / per_iter_s / 2)))
            if factor > 1.0:        # and to add at most half the room
                k = min(k, max(1, int(math.log1p(room / (2 * nodes)) / math.log(factor))))
            limit = match_limit
        t0 = time.perf_counter()
        out = eg._run(_schedule(step, k, limit, ban_length), f"running {' '.join(names)}")
        per_iter_s = (time.perf_counter() - t0) / k
        iterations, granted = iterations + k, 0
        report = out[0].report
        for rule, count in report.num_matches_per_rule.items():
            if ":ruleset shapes" not in rule and rule not in SHAPE_RULE_NAMES:
                matches[rule] = matches.get(rule, 0) + count
        eg._saturate_shapes()
        now = eg._node_count()
        grown, factor = now - nodes, (now / max(nodes, 1)) ** (1.0 / k)
        nodes = now
        last = {"iterations": k, "nodes_added": grown, "match_limit": int(limit)}
        log.append([k, int(limit), nodes])
        if not report.updated:   # back-off reports an update while it holds a rule banned
            stop = "saturated"
            break
        if near and grown == 0:
            # Only rules held back by the match limit (or unions) are left. Try them
            # under doubled limits on a copy (push/pop) and grant the first limit
            # that adds nodes and still fits; one that overflows ends the phase.
            granted, tried, stop = _grant(eg, step, max(2 * limit, last_grant), match_limit, ban_length,
                                               nodes, node_limit, start + time_limit)
            probes, last_grant = probes + tried, max(last_grant, granted)
            if stop:
                break
    return {"rulesets": names, "iterations": iterations, "bursts": len(log), "stop_reason": stop,
            "nodes_before": nodes_before, "nodes_after": nodes, "node_limit": node_limit,
            "overshoot": max(0, nodes - node_limit), "last_burst": last, "burst_log": log,
            "probes": probes, "seconds": round(time.perf_counter() - start, 4), "rule_matches": matches}


def _schedule(step: str, k: int, limit: int, ban_length: int) -> str:
    """egglog text running `step` k times under a fresh back-off scheduler."""
    return (f"(run-schedule (let-scheduler bo (back-off :match-limit {int(limit)} "
            f":ban-length {int(ban_length)})) (repeat {k} {step}))")


def _grant(eg, step, start, match_limit, ban_length, nodes, node_limit, deadline):
    """After a near-limit iteration added no node but changed something (a rule was
    held back, or unions): probe one iteration under match limits `start`, 2 *
    `start`, .. up to match_limit, each on a pushed copy popped after counting.
    Returns (limit to grant, probes run, stop reason or None). The first limit whose
    iteration adds nodes within node_limit is granted; so is match_limit when even it
    adds none but still changes something (unions). A probe that overflows stops with
    "node_limit", one that changes nothing with "saturated" (every rule could fire and
    none had anything to add), the deadline with "time_limit"."""
    probes, limit = 0, min(match_limit, start)
    while True:
        if time.perf_counter() >= deadline:
            return 0, probes, "time_limit"
        eg._run("(push)", "probing a match limit")
        try:
            out = eg._run(_schedule(step, 1, limit, ban_length), "probing a match limit")
            after = eg._node_count()
        finally:
            eg._run("(pop)", "probing a match limit")
        probes += 1
        if after > node_limit:
            return 0, probes, "node_limit"
        if not out[0].report.updated:
            return 0, probes, "saturated"
        if after > nodes or limit >= match_limit:
            return limit, probes, None
        limit = min(match_limit, 2 * limit)


def _expr_calls(expr) -> int:
    """Expr constructor calls in an egglog expression (each may add one e-node)."""
    if not isinstance(expr, bindings.Call):
        return 0
    return (expr.name in OPS) + sum(_expr_calls(a) for a in expr.args)


def _action_calls(action) -> int:
    """Expr constructor calls one action can make (delete/subsume only evaluate args)."""
    if isinstance(action, (bindings.Union,)):
        return _expr_calls(action.lhs) + _expr_calls(action.rhs)
    if isinstance(action, bindings.Let):
        return _expr_calls(action.rhs)
    if isinstance(action, bindings.Set):
        return sum(_expr_calls(a) for a in action.args) + _expr_calls(action.rhs)
    if isinstance(action, bindings.Expr_):
        return _expr_calls(action.expr)
    if isinstance(action, bindings.Change):
        return sum(_expr_calls(a) for a in action.args)
    return 0


def record_rule_sizes(commands, sizes: dict, combined: dict) -> None:
    """Note, per ruleset, the Expr nodes one match of each rule in `commands` can add (a
    birewrite counts as its two rules), and the parts of combined rulesets: the bound
    EGraph.run divides the room under the node limit by."""
    for c in commands:
        if isinstance(c, bindings.RewriteCommand):
            sizes.setdefault(c.name, []).append(_expr_calls(c.rewrite.rhs))
        elif isinstance(c, bindings.BiRewriteCommand):
            sizes.setdefault(c.name, []).extend([_expr_calls(c.rewrite.rhs), _expr_calls(c.rewrite.lhs)])
        elif isinstance(c, bindings.RuleCommand):
            sizes.setdefault(c.rule.ruleset, []).append(sum(_action_calls(a) for a in c.rule.head))
        elif isinstance(c, bindings.UnstableCombinedRuleset):
            combined[c.name] = list(c.rulesets)
