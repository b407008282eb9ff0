"""Running rulesets in bursts under iteration, node, time and memory limits (EGraph.run).

egglog cannot stop inside a `run-schedule`, so the driver runs short bursts and checks the
limits between them. Split out of driver.py, which keeps the e-graph itself; these
functions use its private helpers (`_run`, `_node_count`, `_saturate_shapes`) by design.

Determinism: how many iterations a burst runs and under which match limit depend only on
iteration counts and e-node counts, never on the clock or on memory, because each burst
starts a fresh back-off scheduler, so where bursts end changes which matches are held
back and so what the e-graph holds. The same e-graph and limits therefore give the same
bursts and the same e-graph on an idle and on a loaded machine, unless the time or memory
limit (safety nets, checked between bursts and between probes) stops the run first.

Node limit: the driver predicts the next burst's growth from the measured per-iteration
growth factor of the last burst (a doubling before any is measured). Far from the limit
bursts double in length, cut so the prediction adds at most half the room left, and to
one iteration once the room is below what the last burst added; rules may apply up to
`match_limit` matches each per iteration. Once the next iteration is predicted to
overflow ("near"), every iteration is single and runs under the match limit `room // B`,
B = EGraph.growth_per_match(the rulesets) (the most e-nodes one match of every rule can
add, counted from the rules' right-hand sides when they are loaded: `record_rule_sizes`),
so it cannot add more than the room. When such an iteration adds no node but changes
something (a rule held back), doubled match limits are probed on a copy (egglog
push/pop) and the first that adds nodes within the limit is granted for one iteration
(`_grant`); one that overflows stops with "node_limit" (under the limit: what is left
does not fit), one that changes nothing with "saturated". So a phase ends over its node
limit only when an iteration far from it grew past the whole room: `overshoot` and
`last_burst` report it (at most that burst's growth, a single iteration unless its
prediction was off by more than 2x).
"""
from __future__ import annotations

import math
import os
import re
import time
from dataclasses import dataclass, field

from egglog import bindings

from apsat.egraph.egglog_io import language_text
from apsat.lang.ops import OPS
from apsat.errors import EGraphError

# Rules of the `shapes` ruleset (language.egg, shape_rules.egg): left out of the per-rule
# match counts.
SHAPE_RULE_NAMES = set(re.findall(r':name "([^"]+)"', language_text()))
# A rule's operand-order variants (apsat/rules/commute.py) are named NAME + VARIANT_MARK + K;
# their matches count for NAME.
VARIANT_MARK = "|swapped-"


def base_name(rule_name: str) -> str:
    """The rule a variant's matches count for (its own name for a rule as written)."""
    return rule_name.split(VARIANT_MARK, 1)[0]
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_mib() -> float | None:
    """This process's resident set size in MiB, read from /proc/self/statm (a few
    microseconds, so it can be read between every two bursts); None where that file does
    not exist (not Linux), in which case a memory limit is not enforced."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE_BYTES / 2**20
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class Limits:
    """The limits of one EGraph.run call (its keyword arguments), and when it started."""

    iter_limit: int
    node_limit: int
    time_limit: float
    match_limit: int
    ban_length: int
    start: float
    memory_limit: float | None = None    # MiB of resident memory; None: no limit

    def safety_net(self) -> str | None:
        """"time_limit" or "memory_limit" when that limit is reached, else None."""
        if time.perf_counter() - self.start >= self.time_limit:
            return "time_limit"
        if self.memory_limit is not None and (rss := rss_mib()) is not None and rss > self.memory_limit:
            return "memory_limit"
        return None


@dataclass
class Progress:
    """What run() carries from one burst to the next."""

    nodes: int                 # Expr e-nodes now
    iterations: int = 0
    probes: int = 0            # iterations run on a copy and rolled back
    k: int = 0                 # iterations in the last burst
    grown: int = 0             # e-nodes the last burst added
    factor: float = 2.0        # growth per iteration measured in the last burst
    near: bool = False         # the next iteration may overflow the node limit
    granted: int = 0           # match limit granted by probing, for the next iteration only
    last_grant: int = 0        # the largest one granted so far: probing restarts from it
    last: dict | None = None   # the report's "last_burst"
    matches: dict = field(default_factory=dict)
    log: list = field(default_factory=list)


def run(eg, rulesets, iter_limit: int = 30, node_limit: int = 100_000,
        time_limit: float = 10.0, match_limit: int = 100_000, ban_length: int = 2,
        memory_limit: float | None = None) -> dict:
    """Run the named rulesets (a name or a list) until saturation or a limit.

    Contract: unknown names raise EGraphError before egglog sees them. Iterations run
    in bursts, each one `run-schedule` with a fresh back-off scheduler (a rule
    matching more than the burst's match limit in an iteration applies none of
    those matches and is banned for `ban_length` iterations, doubling), one
    iteration being one step of every named ruleset and four of `shapes`. Between
    bursts shapes are saturated and checked (ShapeError on a conflict or an
    ill-shaped node) and the limits are checked, in this order: iterations, e-nodes,
    then the safety nets time (seconds since the call) and memory (`memory_limit`,
    MiB of this process's resident memory, rss_mib(); None: none). Burst sizes depend
    on iterations and e-nodes only (module docstring), so a run that ends on the
    iteration or node limit, or saturated, is the same on any machine.

    Returns {"rulesets", "iterations", "bursts", "stop_reason" ("saturated",
    "iter_limit", "node_limit", "time_limit" or "memory_limit"), "nodes_before",
    "nodes_after", "node_limit", "overshoot" (nodes over node_limit, 0 when under),
    "last_burst" ({"iterations", "nodes_added", "match_limit"} of the last burst run,
    None when none ran), "burst_log" ([iterations, match limit, nodes after] per burst),
    "probes" (iterations run on a copy and rolled back), "seconds", "rss_mib" (resident
    memory at the end, None where unknown), "rule_matches" (rule name or text ->
    matches, shapes rules left out)}."""
    names = [rulesets] if isinstance(rulesets, str) else list(rulesets)
    for name in names:
        if name not in eg._rulesets:
            raise EGraphError(f"unknown ruleset {name!r}; loaded: {', '.join(eg.rulesets)}")
    lim = Limits(iter_limit, node_limit, time_limit, match_limit, ban_length, time.perf_counter(), memory_limit)
    p = Progress(nodes=eg._node_count())
    nodes_before = p.nodes
    # A few shape steps per iteration so rules guarded by shapes see new nodes; the
    # full (bounded) saturation runs between bursts.
    step = " ".join(f"(run-with bo {n})" for n in names) + " (repeat 4 (run shapes))"
    per_match = max(1, eg.growth_per_match(names))
    while True:
        stop = _limit_reached(p, lim)
        if stop:
            break
        burst = _next_burst(p, lim, per_match)
        if burst is None:
            stop = "node_limit"
            break
        k, limit = burst
        if not _burst(eg, p, step, k, limit, lim.ban_length, names):
            stop = "saturated"   # (back-off reports an update while it holds a rule banned)
            break
        if p.near and p.grown == 0:
            # Only rules held back by the match limit (or unions) are left: probe them.
            p.granted, tried, stop = _grant(eg, step, max(2 * limit, p.last_grant), p.nodes, lim)
            p.probes, p.last_grant = p.probes + tried, max(p.last_grant, p.granted)
            if stop:
                break
    return {"rulesets": names, "iterations": p.iterations, "bursts": len(p.log), "stop_reason": stop,
            "nodes_before": nodes_before, "nodes_after": p.nodes, "node_limit": node_limit,
            "overshoot": max(0, p.nodes - node_limit), "last_burst": p.last, "burst_log": p.log,
            "probes": p.probes, "seconds": round(time.perf_counter() - lim.start, 4),
            "rss_mib": _rounded(rss_mib()), "rule_matches": p.matches}


def _rounded(x: float | None) -> float | None:
    return None if x is None else round(x, 1)


def _limit_reached(p: Progress, lim: Limits) -> str | None:
    """The stop reason when a limit is already reached. The deterministic limits come
    first, so a run that reaches one of them reports it whatever the clock says."""
    if p.iterations >= lim.iter_limit:
        return "iter_limit"
    if lim.node_limit - p.nodes <= 0:
        return "node_limit"
    return lim.safety_net()


def _next_burst(p: Progress, lim: Limits, per_match: int) -> tuple[int, int] | None:
    """(iterations, match limit) of the next burst; None when near the node limit and not
    even one match fits. A function of iteration and node counts only (no clock: see the
    module docstring).

    Near the node limit (the next iteration predicted to overflow by the geometric growth
    of the last burst: exploratory rules multiply the graph) it is one iteration under
    `room // per_match`: even if every rule applied that many matches, each adding all its
    right-hand side, the iteration would fit. Once near, stay near: a throttled
    iteration's small growth says nothing about what the held-back rules would add."""
    room = lim.node_limit - p.nodes
    p.near = p.near or room < p.nodes * (p.factor - 1.0)
    if p.near:
        limit = min(lim.match_limit, max(p.granted, room // per_match))
        return (1, limit) if limit else None
    # Far: double the burst; single iterations once the room is below what the last one added
    k = 1 if room < p.grown else min(2 * p.k or 1, lim.iter_limit - p.iterations)
    if p.factor > 1.0:        # and add at most half the room
        k = min(k, max(1, int(math.log1p(room / (2 * p.nodes)) / math.log(p.factor))))
    return k, lim.match_limit


def _burst(eg, p: Progress, step: str, k: int, limit: int, ban_length: int, names) -> bool:
    """Run `step` k times under match limit `limit`, then saturate and check shapes and
    record the burst in `p` (growth, matches, log). True iff egglog reports that
    something changed."""
    out = eg._run(_schedule(step, k, limit, ban_length), f"running {' '.join(names)}")
    p.iterations, p.granted, p.k = p.iterations + k, 0, k
    report = out[0].report
    for rule, count in report.num_matches_per_rule.items():
        if ":ruleset shapes" not in rule and rule not in SHAPE_RULE_NAMES:
            rule = base_name(rule)          # an operand-order variant counts for its rule
            p.matches[rule] = p.matches.get(rule, 0) + count
    eg._saturate_shapes()
    now = eg._node_count()
    p.grown, p.factor = now - p.nodes, (now / max(p.nodes, 1)) ** (1.0 / k)
    p.nodes = now
    p.last = {"iterations": k, "nodes_added": p.grown, "match_limit": int(limit)}
    p.log.append([k, int(limit), p.nodes])
    return pending(report)


def pending(report) -> bool:
    """True while a burst changed the e-graph or its back-off scheduler still holds a rule
    banned (matches deferred). egglog 13.2 counts a ban as an update (`updated`); egglog 14
    sets `updated` only for database changes and reports deferred work as `can_stop` False
    (absent on 13.2, hence the default)."""
    return bool(report.updated) or not getattr(report, "can_stop", True)


def _schedule(step: str, k: int, limit: int, ban_length: int) -> str:
    """egglog text running `step` k times under a fresh back-off scheduler."""
    return (f"(run-schedule (let-scheduler bo (back-off :match-limit {int(limit)} "
            f":ban-length {int(ban_length)})) (repeat {k} {step}))")


def _grant(eg, step, start, nodes, lim: Limits):
    """After a near-limit iteration added no node but changed something (a rule was
    held back, or unions): probe one iteration under match limits `start`, 2 *
    `start`, .. up to lim.match_limit, each on a pushed copy popped after counting.
    Returns (limit to grant, probes run, stop reason or None). The first limit whose
    iteration adds nodes within lim.node_limit is granted; so is lim.match_limit when
    even it adds none but still changes something (unions). A probe that overflows
    stops with "node_limit", one that changes nothing with "saturated" (every rule
    could fire and none had anything to add), the time or memory limit with its name
    (each probe copies the e-graph)."""
    probes, limit = 0, min(lim.match_limit, start)
    while True:
        net = lim.safety_net()
        if net:
            return 0, probes, net
        eg._run("(push)", "probing a match limit")
        try:
            out = eg._run(_schedule(step, 1, limit, lim.ban_length), "probing a match limit")
            after = eg._node_count()
        finally:
            eg._run("(pop)", "probing a match limit")
        probes += 1
        if after > lim.node_limit:
            return 0, probes, "node_limit"
        if not pending(out[0].report):
            return 0, probes, "saturated"
        if after > nodes or limit >= lim.match_limit:
            return limit, probes, None
        limit = min(lim.match_limit, 2 * limit)


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


def growth_per_match(rulesets, rule_sizes: dict, combined: dict) -> int:
    """The most Expr nodes one match of every rule of `rulesets` (names, a combined
    ruleset counting its parts once) can add together: the sum over the rules of the
    constructor calls on their right-hand sides (`rule_sizes`, ruleset -> per rule, as
    record_rule_sizes keeps it; `combined`, combined ruleset -> its parts). A rule adds
    at most those per match, fewer when some already exist. 0 for rulesets with no
    rules, or unknown names."""
    todo, seen, total = list([rulesets] if isinstance(rulesets, str) else rulesets), set(), 0
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo.extend(combined.get(name, ()))
        total += sum(rule_sizes.get(name, ()))
    return total
