"""An e-graph in the extraction-gym JSON format (egraph-serialize), ready for extractors.

Format: `nodes` maps a node id to {op, children (node ids), eclass, cost}; `class_data`
maps class ids to {type, ...}; `root_eclasses` lists roots. Extractors work on class ids:
`classes[c]` lists the candidate node ids of class c and `node_classes[n]` the class ids of
node n's children (in order, repeats kept: a tree extractor counts every use).

Serialised egglog e-graphs also hold the rows of analysis functions (`dim`, `ndim`, ...)
as nodes whose class is an i64 class. Those are not program constructs: `extractable`
filters them out so no extractor can pick `dim(x, 0)` as "the value 3".
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class ExtractionGraph:
    """Nodes and classes of one serialised e-graph (only extractable nodes kept)."""

    nodes: dict[str, dict]
    classes: dict[str, list[str]]
    node_classes: dict[str, list[str]]
    roots: list[str]
    class_types: dict[str, str] = field(default_factory=dict)
    dropped: int = 0  # nodes filtered out as not extractable
    # Class id -> access shape, filled in by apsat.extract.extract for cost models that
    # price nodes by their sizes (None for a bare extraction-gym file).
    shapes: dict | None = None
    # Tensor names known at load time (the e-graph's weights), for cost models that charge
    # weight-only work nothing per inference (apsat/extract/constants.py).
    weights: frozenset = frozenset()

    @classmethod
    def from_json(cls, data, extractable=None) -> "ExtractionGraph":
        """Build from a parsed JSON dict (or a path / JSON text). `extractable(node_id, node)`
        decides which nodes may be chosen (default: all). Children that point at filtered
        nodes' classes still resolve, through the class of the child node."""
        if isinstance(data, (str, Path)) and Path(str(data)).exists():
            data = json.loads(Path(data).read_text())
        elif isinstance(data, str):
            data = json.loads(data)
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
        types = {c: d.get("type", "") for c, d in data.get("class_data", {}).items()}
        roots = [str(r) for r in data.get("root_eclasses", [])]
        return cls(nodes, classes, node_classes, roots, types, dropped)

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
