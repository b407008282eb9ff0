"""Results of batch runs, stored under a content key so that a re-run reuses them.

A model's key is the SHA-256 of everything its result depends on: the model file's bytes,
the target, the text of every rule file given, the options, apsat's version, and for gpu
targets the cost model's calibration in force. A result
is a JSON record written atomically (a temporary file in the same directory, then
`os.replace`), so a run killed at any moment, `kill -9` included, leaves either the whole
record or none: a later run never trusts a half-written one. Only successful results are
stored; a failed model is tried again next time.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from importlib import metadata
from pathlib import Path

STORE_VERSION = 1      # bump when the record's layout changes: old records stop matching


def apsat_version() -> str:
    """The installed apsat's version ("unknown" when run from a bare checkout)."""
    try:
        return metadata.version("apsat")
    except metadata.PackageNotFoundError:
        return "unknown"


def content_key(model_bytes: bytes, target: str, rule_texts: list[str], options: dict) -> str:
    """The hex SHA-256 naming a result: model bytes, target, rule files' text (in order),
    options (JSON with sorted keys), apsat's version, the store's layout version and, for
    gpu targets, the active cost-model calibration."""
    h = hashlib.sha256()
    for part in (b"apsat-result", str(STORE_VERSION).encode(), apsat_version().encode(),
                 target.encode(), json.dumps(options, sort_keys=True, default=str).encode()):
        h.update(len(part).to_bytes(8, "little") + part)
    for text in rule_texts:
        data = text.encode()
        h.update(len(data).to_bytes(8, "little") + data)
    h.update(hashlib.sha256(model_bytes).digest())
    h.update(_cost_figures(target))
    return h.hexdigest()


def _cost_figures(target: str) -> bytes:
    """What the target's cost model reads besides the options: for gpu targets the
    calibration in force (apsat/targets/gpu_calibration.py), so that a result priced
    under other figures is not reused."""
    if target.split(":")[0] != "gpu":
        return b""
    from apsat.targets import gpu_calibration

    cal = gpu_calibration.active()
    return b"" if cal is None else json.dumps(cal.to_json(), sort_keys=True).encode()


class ResultStore:
    """Records by content key under `root/results/` (created on first write)."""

    def __init__(self, root):
        self.root = Path(root) / "results"

    def path(self, key: str) -> Path:
        return self.root / f"{key}.json"

    def load(self, key: str) -> dict | None:
        """The stored record, or None when there is none (or it does not parse: a record
        from another tool or a damaged disk is not trusted)."""
        try:
            record = json.loads(self.path(key).read_text())
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) and record.get("key") == key else None

    def save(self, key: str, record: dict) -> Path:
        """Write the record atomically; returns its path."""
        self.root.mkdir(parents=True, exist_ok=True)
        data = json.dumps({**record, "key": key}, indent=1, default=str) + "\n"
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=f".{key[:16]}-", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path(key))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return self.path(key)
