"""An e-graph in the extraction-gym JSON format (egraph-serialize), ready for extractors.

Format: `nodes` maps a node id to {op, children (node ids), eclass, cost}; `class_data`
maps class ids to {type, ...}; `root_eclasses` lists roots. Extractors work on class ids:
`classes[c]` lists the candidate node ids of class c and `node_classes[n]` the class ids of
node n's children (in order, repeats kept: a tree extractor counts every use).

Serialised egglog e-graphs also hold the rows of analysis functions (`dim`, `ndim`, ...)
as nodes whose class is an i64 class. Those are not program constructs: `extractable`
filters them out so no extractor can pick `dim(x, 0)` as "the value 3".

E-graphs serialised by apsat's driver also carry each Expr class's access shape in
class_data (`"shape"`, apsat/extract/shapes.py): `shapes` is read from there, and each
typed Expr class's element type (`"dtype"`: f32, f16 or bf16; apsat/egraph/serialize.py):
`dtypes`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from apsat.errors import ExtractionError
from apsat.extract.shapes import read_shapes
from apsat.lang.dtypes import BYTES


@dataclass
class ExtractionGraph:
    """Nodes and classes of one serialised e-graph (only extractable nodes kept)."""

    nodes: dict[str, dict]
    classes: dict[str, list[str]]
    node_classes: dict[str, list[str]]
    roots: list[str]
    class_types: dict[str, str] = field(default_factory=dict)
    dropped: int = 0  # nodes filtered out as not extractable
    # Class id -> access shape ((iterated dims), (item dims)), read from class_data, for
    # cost models that price nodes by their sizes and for decoding (None for a bare
    # extraction-gym file, which carries no shapes).
    shapes: dict | None = None
    # Tensor names known at load time (the e-graph's weights), for cost models that charge
    # weight-only work nothing per inference (apsat/extract/constants.py).
    weights: frozenset = frozenset()
    # Class id -> element type ("f32", "f16", "bf16") of the typed Expr classes (exact
    # values and a bare extraction-gym file: absent), for the gpu cost model's bytes and peaks.
    dtypes: dict = field(default_factory=dict)

    @classmethod
    def from_json(cls, data, extractable=None) -> "ExtractionGraph":
        """Build from a parsed JSON dict (or a path / JSON text). `extractable(node_id, node)`
        decides which nodes may be chosen (default: all). Children that point at filtered
        nodes' classes still resolve, through the class of the child node. ExtractionError
        (an ApsatError and a ValueError; one line) for data that is not shaped like extraction-gym JSON."""
        try:
            if isinstance(data, (str, Path)) and Path(str(data)).exists():
                data = json.loads(Path(data).read_text())
            elif isinstance(data, str):
                data = json.loads(data)
        except ValueError as exc:  # json's JSONDecodeError, UnicodeDecodeError
            raise ExtractionError(f"not JSON: {exc}") from None
        _check_layout(data)
        raw = data["nodes"]
        nodes, classes, node_classes, dropped = {}, {}, {}, 0
        for nid, node in raw.items():
            if extractable is not None and not extractable(nid, node):
                dropped += 1
                continue
            nodes[nid] = node
            classes.setdefault(node["eclass"], []).append(nid)
        for nid, node in nodes.items():
            node_classes[nid] = [raw[ch]["eclass"] if ch in raw else ch for ch in node["children"]]
        class_data = data.get("class_data", {})
        types = {c: d.get("type", "") for c, d in class_data.items()}
        roots = [str(r) for r in data.get("root_eclasses", [])]
        typed = {c: d["dtype"] for c, d in class_data.items() if d.get("dtype") in BYTES}
        return cls(nodes, classes, node_classes, roots, types, dropped, read_shapes(class_data), dtypes=typed)

    def cost(self, node_id: str) -> float:
        """The node's own cost as stored in the file."""
        return float(self.nodes[node_id].get("cost", 1.0))

    def parents(self) -> dict[str, list[str]]:
        """Class id -> ids of the nodes that have it as a child (each node once)."""
        out: dict[str, list[str]] = {c: [] for c in self.classes}
        for nid, kids in self.node_classes.items():
            for c in set(kids):
                out.setdefault(c, []).append(nid)
        return out


def _check_layout(data) -> None:
    """ExtractionError unless `data` has extraction-gym JSON's layout: an object whose "nodes"
    maps ids to objects with "op", an "eclass" id, a "children" list of ids and a numeric
    "cost" (if any), whose "class_data" (if any) maps class ids to objects and whose
    "root_eclasses" (if any) is a list."""
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), dict):
        raise ExtractionError('expected a JSON object with a "nodes" object')
    for nid, node in data["nodes"].items():
        if not (isinstance(node, dict) and {"op", "eclass"} <= node.keys()
                and isinstance(node.get("children"), list)):
            raise ExtractionError(f'node {nid!r} is not an object with "op", "eclass" and "children"')
        if not all(isinstance(i, (str, int)) for i in [node["eclass"], *node["children"]]):
            raise ExtractionError(f'node {nid!r}: "eclass" and "children" must be ids (strings)')
        cost = node.get("cost", 1.0)
        if isinstance(cost, bool) or not isinstance(cost, (int, float)) or cost < 0:
            raise ExtractionError(f'node {nid!r}: "cost" must be a non-negative number, not {cost!r}')
    class_data = data.get("class_data", {})
    if not isinstance(class_data, dict) or not all(isinstance(d, dict) for d in class_data.values()):
        raise ExtractionError('"class_data" must map class ids to objects')
    if not isinstance(data.get("root_eclasses", []), list):
        raise ExtractionError('"root_eclasses" must be a list')
