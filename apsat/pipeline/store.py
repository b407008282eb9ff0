"""Results of batch runs, stored under a content key so that a re-run reuses them.

A model's key is the SHA-256 of everything its result depends on: the model file's bytes,
the target, the text of every rule file given, the options, apsat's version, a digest of
apsat's own source (`source_digest`: its code, built-in rule files, op registry and data
files, so that a result computed by other code, or under a changed built-in rule, is not
reused), and for gpu targets the cost model's calibration in force. The key is computed
by the process that owns the store (the caller of a batch), never by a worker; each
result row carries the digest of the source that computed it, and the caller stores only
rows whose digest is its own (`same_source`). A result
is a JSON record written atomically (a temporary file in the same directory, then
`os.replace`), so a run killed at any moment, `kill -9` included, leaves either the whole
record or none: a later run never trusts a half-written one. Only successful results are
stored; a failed model is tried again next time.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from importlib import metadata
from pathlib import Path

STORE_VERSION = 1      # bump when the record's layout changes: old records stop matching
# the package files that can change a result: code, rule and registry files, data files
SOURCE_SUFFIXES = (".py", ".egg", ".json", ".toml")
PACKAGE_ROOT = Path(__file__).resolve().parents[1]      # the apsat package directory


def apsat_version() -> str:
    """The installed apsat's version ("unknown" when run from a bare checkout)."""
    try:
        return metadata.version("apsat")
    except metadata.PackageNotFoundError:
        return "unknown"


def source_digest(root: str | Path | None = None) -> str:
    """The hex SHA-256 of apsat's source under `root` (default: the package in use, hashed
    once per process): every file ending in SOURCE_SUFFIXES, by sorted path relative to
    `root`, each path and its bytes hashed; __pycache__ and hidden directories skipped.
    Files rather than a git commit: a commit misses uncommitted edits and an installed
    copy has none."""
    if root is None:
        return _installed_source_digest()
    return _tree_digest(Path(root))


@functools.cache       # once: the source this process imported (walking it costs ~5 ms)
def _installed_source_digest() -> str:
    return _tree_digest(PACKAGE_ROOT)


def _tree_digest(root: Path) -> str:
    # each part length-prefixed: moving bytes between a path and its file changes the digest
    h = hashlib.sha256()
    for rel in sorted(_source_files(root)):
        for part in (rel.encode(), (root / rel).read_bytes()):
            h.update(len(part).to_bytes(8, "little") + part)
    return h.hexdigest()


def _source_files(root: Path) -> list[str]:
    """Paths (POSIX, relative to `root`) of the files source_digest covers."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != "__pycache__" and not d.startswith(".")]
        found += [Path(folder, f).relative_to(root).as_posix() for f in files if f.endswith(SOURCE_SUFFIXES)]
    return found


OTHER_SOURCE = ("not stored: computed by other apsat source than the caller's (a worker with "
                "another apsat installed, or apsat edited during the run)")


def same_source(row: dict) -> bool:
    """Whether the result `row` was computed by this process's apsat source: its
    "source_digest" (set by the process that ran the model, batch.run_task) is ours. A
    row that is not, and holds a result, gets the notice OTHER_SOURCE (in place): its
    result must not be stored under a key that names this source."""
    if row.get("source_digest") == source_digest():
        return True
    if row.get("status") in ("ok", "mismatch"):
        row["notices"] = [*(row.get("notices") or []), OTHER_SOURCE]
    return False


def content_key(model_bytes: bytes, target: str, rule_texts: list[str], options: dict) -> str:
    """The hex SHA-256 naming a result: model bytes, target, rule files' text (in order),
    options (JSON with sorted keys), apsat's version and source digest (`source_digest`:
    code, built-in rules, op registry), the store's layout version and, for gpu targets,
    the active cost-model calibration. Equal keys promise equal results: anything else
    that can change a result must be added here."""
    h = hashlib.sha256()
    for part in (b"apsat-result", str(STORE_VERSION).encode(), apsat_version().encode(),
                 source_digest().encode(),
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
