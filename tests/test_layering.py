"""The layers point one way. Each package of apsat imports only the packages listed for it
below, directly or through any chain of imports (imports inside functions count too):

    faces      cli.py, explore/, apsat/__init__.py (the facade)
    pipeline   optimize, verify, soundness, the zoo
    backends   reference, gpu, systolic
    extract    cost models, extractors, checks
    frontend   ONNX -> Program
    rules      rule files, loader, saturation plans
    egraph     the egglog driver
    targets    machine descriptions and their analytical models
    lang       the op registry, terms, syntax, shapes, reference semantics
    errors     (imports nothing of apsat)
"""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "apsat"

_BELOW_PIPELINE = {"backends", "extract", "frontend", "rules", "egraph", "targets", "lang", "errors"}
ALLOWED = {
    "errors": set(),
    "lang": {"errors"},
    "targets": {"errors"},
    "egraph": {"lang", "targets", "errors"},
    "rules": {"egraph", "lang", "targets", "errors"},
    "frontend": {"lang", "errors"},
    "extract": {"lang", "targets", "errors"},
    "backends": {"extract", "lang", "targets", "errors"},
    "pipeline": _BELOW_PIPELINE,
    "explore": _BELOW_PIPELINE | {"pipeline"},
    "cli": _BELOW_PIPELINE | {"pipeline", "explore"},
    "__init__": _BELOW_PIPELINE | {"pipeline", "explore"},
}


def _module_name(path: Path) -> str:
    parts = ("apsat",) + path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package(module: str) -> str:
    """The layer a module belongs to: apsat.X.* -> X; apsat itself -> __init__."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path, modules: set[str]) -> set[str]:
    """apsat modules that `path` imports anywhere in its text (`from apsat.a import b`
    counts apsat.a.b when that is a module, else apsat.a)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        out |= {n for n in names if n in modules}
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the apsat modules it imports directly (a module imports its packages'
    __init__ too, as Python runs them)."""
    paths = {_module_name(p): p for p in ROOT.rglob("*.py")}
    modules = set(paths)
    graph = {}
    for name, path in paths.items():
        direct = _imports(path, modules)
        for m in list(direct):
            parts = m.split(".")
            direct |= {".".join(parts[:i]) for i in range(2, len(parts))} & modules
        graph[name] = direct - {name}
    return graph


def reachable(graph, start) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


GRAPH = import_graph()


def test_every_package_has_a_layer():
    assert {_package(m) for m in GRAPH} <= set(ALLOWED), \
        f"packages without a layer: {sorted({_package(m) for m in GRAPH} - set(ALLOWED))}"


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_no_arrow_points_up(module):
    own = _package(module)
    bad = sorted(m for m in reachable(GRAPH, module)
                 if _package(m) != own and _package(m) not in ALLOWED[own])
    assert not bad, f"{module} ({own}) reaches {bad}; {own} may import only {sorted(ALLOWED[own])}"


def test_the_check_sees_chains():
    """The walk is transitive: a chain a -> b -> c reaches c (guards against a check that
    only looks at direct imports)."""
    graph = {"a": {"b"}, "b": {"c"}, "c": set()}
    assert reachable(graph, "a") == {"b", "c"}
