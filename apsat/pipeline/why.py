"""Why a rule fired, or where its matching stopped: `apsat rules why`.

`rule_why(eg, rule)` asks a saturated e-graph about one loader Rule. Every part of the
rule's pattern is asked as an egglog query (EGraph.sites: one rule run once on a pushed
copy, so the answer is egglog's own matching, `:when` conditions and relations included):

1. the whole pattern, each operand-order variant: where it matches, the rule fired there;
2. else each node with its ancestors (a path; one batch of probes for every variant): the
   nodes whose path matches somewhere form the variant's matched part, and the variant with
   the largest part is the one shown;
3. that part at once, with its first missing node (in pre-order) as the place to report: the
   classes where the part matched, whose members are shown in the language's syntax. When
   the paths match one by one but not together (a variable used twice that binds two
   classes), the part is grown node by node instead, keeping each node that still matches.

Probes cost one push/pop of the e-graph each batch, so steps 1 and 2 are one batch each
and step 3 is one, or a node at a time only in the last case.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from apsat.errors import RuleError
from apsat.extract.decode import language_graph, node_args
from apsat.rules.loader import Rule
from apsat.rules.library import RuleLibrary
from apsat.rules.patterns import Query, rule_queries

MAX_SHOWN_CLASSES = 3     # the classes where matching stopped, shown with their members
MAX_SHOWN_MEMBERS = 6


@dataclass
class RuleWhy:
    """The answer for one rule. `fired`: the whole pattern matches somewhere now (the rule
    has merged its right side there); `sites`: those classes, or, when it did not fire, the
    classes where the matched part reached its first missing node; `variant`: the operand
    order shown; `matched` / `total`: pattern nodes matched of all; `part`: the pattern with
    unmatched nodes as `_`; `missing`: the first sub-pattern that did not match (with the
    conditions it brings), None when it fired; `members`: class id -> its members' text;
    `matches_during_run`: what the saturation report counted for the rule (None: not given)."""

    rule: str
    where: str
    fired: bool
    variant: str
    matched: int
    total: int
    part: str
    sites: list[str] = field(default_factory=list)
    missing: str | None = None
    members: dict[str, list[str]] = field(default_factory=dict)
    matches_during_run: int | None = None

    def __str__(self) -> str:
        lines = [f"rule {self.rule} ({self.where}): " + (
            f"fired: its pattern matches at {len(self.sites)} e-class(es)" if self.fired
            else "did not fire" if self.matched else "did not fire: no part of its pattern matches")]
        if self.matches_during_run is not None:
            lines.append(f"  matches during saturation: {self.matches_during_run}")
        if self.variant != self.rule:
            lines.append(f"  operand order shown: {self.variant}")
        if not self.fired:
            lines.append(f"  matched {self.matched} of {self.total} pattern nodes: {self.part}")
            lines.append(f"  first sub-pattern that did not match: {self.missing}")
        if self.sites:
            lines.append(("  where it matched" if self.fired else "  where matching stopped") +
                         f" ({len(self.sites)} e-class(es), {min(len(self.sites), MAX_SHOWN_CLASSES)} shown):")
        for cls, texts in self.members.items():
            lines.append(f"    e-class {cls}:")
            lines.extend(f"      {t}" for t in texts)
        return "\n".join(lines)


def rule_why(eg, rule: Rule, matches_during_run: int | None = None) -> RuleWhy:
    """Whether `rule` (a loader Rule) matches in `eg` (a saturated apsat EGraph) and, if
    not, how far its pattern matches and where it stops (module doc). The e-graph is left
    as it was."""
    queries = rule_queries(rule)
    where = f"{rule.path}:{rule.line}"
    if not queries:
        return RuleWhy(rule.name, where, False, rule.name, 0, 0, "(no constructor pattern to match)")
    whole = eg.sites([(q.facts(q.everything()), q.site(0)) for q in queries])
    for q, sites in zip(queries, whole):
        if sites:
            n = len(q.nodes)
            return _with_members(eg, RuleWhy(rule.name, where, True, q.name, n, n, q.shown(q.everything()),
                                              sites, None, {}, matches_during_run))
    paths = eg.sites([(q.facts(q.path(n.index)), q.site(n.index)) for q in queries for n in q.nodes])
    parts, at = [], 0
    for q in queries:
        parts.append({n.index for n, s in zip(q.nodes, paths[at:at + len(q.nodes)]) if s})
        at += len(q.nodes)
    best = max(range(len(queries)), key=lambda i: len(parts[i]))
    q, part = queries[best], parts[best]
    part, missing, sites = _stop(eg, q, part)
    shown_missing = None if missing is None else " ".join([q.text_of(missing)] + q.conditions_new_at(missing))
    answer = RuleWhy(rule.name, where, False, q.name, len(part), len(q.nodes), q.shown(part),
                     sites, shown_missing, {}, matches_during_run)
    return _with_members(eg, answer)


def _stop(eg, q: Query, part: set[int]) -> tuple[set[int], int | None, list[str]]:
    """(matched part, first missing node, classes where the part reached it) for a part
    whose nodes each match on their own: checked together, else grown node by node."""
    missing = _first_missing(q, part)
    if not part:
        return part, missing, []
    site = q.site(missing) if missing is not None else q.site(0)
    found = eg.sites([(q.facts(part), site)])[0]
    if found:
        return part, missing, found
    grown, found = set(), []
    for node in q.nodes:
        if node.index not in part or (node.parent is not None and node.parent not in grown):
            continue
        trial = grown | {node.index}
        sites = eg.sites([(q.facts(trial), q.site(node.index))])[0]
        if sites:
            grown = trial
    missing = _first_missing(q, grown)
    if grown:
        found = eg.sites([(q.facts(grown), q.site(missing) if missing is not None else q.site(0))])[0] or []
    return grown, missing, found


def _first_missing(q: Query, part: set[int]) -> int | None:
    """The first node in pre-order outside `part` whose parent is in it (or a root)."""
    for node in q.nodes:
        if node.index not in part and (node.parent is None or node.parent in part):
            return node.index
    return None


def _with_members(eg, answer: RuleWhy) -> RuleWhy:
    """Fill `answer.members` for its first MAX_SHOWN_CLASSES sites."""
    if not answer.sites:
        return answer
    graph = language_graph(eg.serialize())
    for cls in answer.sites[:MAX_SHOWN_CLASSES]:
        nids = [n for n in graph.classes.get(cls, []) if graph.nodes[n]["op"] not in ("icons", "inil", "enil", "econs")]
        answer.members[cls] = [member_text(graph, n) for n in nids[:MAX_SHOWN_MEMBERS]]
        if len(nids) > MAX_SHOWN_MEMBERS:
            answer.members[cls].append(f"... {len(nids) - MAX_SHOWN_MEMBERS} more")
    return answer


def member_text(graph, nid: str) -> str:
    """An e-node in the language's syntax, its Expr children written as their classes."""
    args = node_args(graph, nid, lambda c: _ClassRef(c))
    return "(" + " ".join([graph.nodes[nid]["op"]] + [_arg(a) for a in args]) + ")"


class _ClassRef(str):
    """An Expr child shown as its class id."""


def _arg(a) -> str:
    if isinstance(a, _ClassRef):
        return f"<{a}>"
    if isinstance(a, tuple):
        return "(" + " ".join(_arg(x) for x in a) + ")"
    if hasattr(a, "op"):     # an attribute Term: a compute operator, pad type, access shape
        return "(" + " ".join([a.op] + [_arg(x) for x in a.args]) + ")"
    return repr(a) if isinstance(a, str) else str(a)



def why_on_model(model, rule_name: str, files=(), target="gpu") -> RuleWhy:
    """`apsat rules why`: import `model` (a path or Model), saturate it with the target's
    plan and then, if the rule's ruleset is not in the plan, that ruleset as one more phase
    (`files`: rule files or directories to load first, where the rule may live), and answer
    for `rule_name`. RuleError for an unknown rule, ModelError for a bad model."""
    from apsat.egraph.driver import EGraph
    from apsat.frontend.importer import load_onnx
    from apsat.rules.saturate import default_plan, saturate

    library = RuleLibrary(files)
    rule = library.rules.get(rule_name)
    if rule is None:
        raise unknown_rule(rule_name, library.rules)
    m = model if hasattr(model, "program") else load_onnx(model)
    eg = EGraph(target=target)
    eg.add_outputs(m.program)
    reports = [saturate(eg, library=library)]
    if not any(rule.ruleset in phase.rulesets for phase in default_plan(eg.target, library)):
        reports.append(saturate(eg, [rule.ruleset], library=library))
    counted = sum(p["rule_matches"].get(rule.name, 0) for r in reports for p in r["phases"])
    return rule_why(eg, rule, counted)


def unknown_rule(name: str, known) -> RuleError:
    """The one-line error for a rule name no file defines, with the closest names."""
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.5)
    hint = f" (did you mean {', '.join(close)}?)" if close else " (`apsat rules list` names them)"
    return RuleError(f"unknown rule '{name}'{hint}")
