"""Loaded e-graphs kept for the next `optimize` in this process.

Why: a fresh e-graph with the target's rules costs about 0.6 s before any model is in it
(the language 0.1 s, egglog compiling the plan's 170-odd rules 0.47 s, measured on this
machine), more than saturating a small model. `acquire(target)` hands out an e-graph with
the language, the target's facts and every ruleset of the target's default plan loaded,
pushed (EGraph.push), so what a run adds goes with `release(eg)`'s pop; the e-graph then
waits, loaded, for the next run. An e-graph of a run that failed is never released, so a
half-finished state is never handed out again.

Only the default plan's runs use it: a run with the user's rules builds its own e-graph
and library (a rule file adds to the library it is read into). Each e-graph carries the
built-in rule files' sizes and modification times it was loaded from, and is not handed
out once they change (a rule edited in a session is read again). Thread-safe: each
e-graph is used by one run at a time; a second run at once builds another.
"""
from __future__ import annotations

import threading

from apsat.egraph.driver import EGraph
from apsat.rules.library import RuleLibrary, builtin_stamp
from apsat.rules.saturate import default_plan
from apsat.targets import parse_target

MAX_IDLE = 2          # loaded e-graphs kept per target (each a few MiB)
_IDLE: dict[tuple, list[EGraph]] = {}
_LOCK = threading.Lock()


def acquire(target) -> EGraph:
    """A loaded e-graph for `target` (module doc), pushed; `eg.library` is its library.
    Give it back with release() once the run is done with it."""
    tgt = parse_target(target)
    stamp = builtin_stamp()
    key = (repr(tgt), stamp)
    with _LOCK:
        for stale in [k for k in _IDLE if k[1] != stamp]:     # loaded from rule files since edited
            del _IDLE[stale]
        idle = _IDLE.get(key)
        eg = idle.pop() if idle else None
    if eg is None:
        eg = EGraph(target=tgt)
        library = RuleLibrary()
        library.load_into(eg, [r for phase in default_plan(eg.target, library) for r in phase.rulesets])
        eg.library = library
        eg.pool_key = key
    eg.push()
    return eg


def release(eg: EGraph) -> None:
    """Pop what the run added (its saturated state goes here) and keep the e-graph for the
    next run of its target, unless MAX_IDLE wait already or it came from no acquire()."""
    key = getattr(eg, "pool_key", None)
    if key is None:
        return
    eg.pop()
    with _LOCK:
        idle = _IDLE.setdefault(key, [])
        if len(idle) < MAX_IDLE:
            idle.append(eg)
