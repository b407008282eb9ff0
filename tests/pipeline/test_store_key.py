"""Store keys cover apsat itself (apsat.pipeline.store.source_digest): a changed built-in
rule, op registry entry or line of code gives another key, so a batch recomputes its models
instead of serving results that the old code computed."""
from __future__ import annotations

import shutil
from pathlib import Path

import onnx
import pytest
from models import elementwise_chain

import apsat
from apsat.pipeline import store as store_mod
from apsat.pipeline.batch import Task, run_local
from apsat.pipeline.store import PACKAGE_ROOT, ResultStore, content_key, source_digest


@pytest.fixture(scope="module")
def package_copy(tmp_path_factory) -> Path:
    """A copy of the apsat package as it is now (no __pycache__)."""
    dst = tmp_path_factory.mktemp("pkg") / "apsat"
    shutil.copytree(PACKAGE_ROOT, dst, ignore=shutil.ignore_patterns("__pycache__"))
    return dst


def _copy(package_copy: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "apsat"
    shutil.copytree(package_copy, dst)
    return dst


def _change_line(path: Path, index: int = 0) -> None:
    lines = path.read_text().splitlines(keepends=True)
    lines[index] = lines[index].rstrip("\n") + "  \n"        # a trailing space: still a change
    path.write_text("".join(lines))


def test_the_default_is_the_package_in_use_hashed_once(monkeypatch):
    assert PACKAGE_ROOT == Path(apsat.__file__).resolve().parent
    calls = []
    monkeypatch.setattr(store_mod, "_tree_digest", lambda root: calls.append(root) or "d" * 64)
    store_mod._installed_source_digest.cache_clear()
    try:
        assert source_digest() == source_digest() == "d" * 64 and calls == [PACKAGE_ROOT]
    finally:
        store_mod._installed_source_digest.cache_clear()     # not the fake's value for later tests


def test_an_unchanged_copy_has_the_same_digest(package_copy, tmp_path):
    digest = source_digest(package_copy)
    assert len(digest) == 64 and source_digest(_copy(package_copy, tmp_path)) == digest


@pytest.mark.parametrize("rel", ["rules/fusion.egg", "lang/ops.py", "pipeline/verify.py", "lang/language.egg"])
def test_a_changed_line_in_a_source_file_changes_the_digest(package_copy, tmp_path, rel):
    """A built-in rule, the op registry, any code: each counts."""
    copy = _copy(package_copy, tmp_path)
    _change_line(copy / rel)
    assert source_digest(copy) != source_digest(package_copy)


def test_added_and_renamed_files_count_caches_do_not(package_copy, tmp_path):
    base = source_digest(package_copy)
    copy = _copy(package_copy, tmp_path)
    (copy / "rules" / "__pycache__").mkdir()
    (copy / "rules" / "__pycache__" / "library.cpython-311.pyc").write_bytes(b"\0compiled")
    (copy / "rules" / "notes.txt").write_text("not read by apsat")
    assert source_digest(copy) == base
    (copy / "rules" / "extra.egg").write_text("(ruleset extra)\n")
    added = source_digest(copy)
    assert added != base
    (copy / "rules" / "extra.egg").rename(copy / "rules" / "other.egg")     # same bytes, another path
    assert source_digest(copy) not in (base, added)


def test_content_key_follows_the_source_digest(monkeypatch):
    before = content_key(b"model", "systolic", [], {"seed": 0})
    monkeypatch.setattr(store_mod, "source_digest", lambda root=None: "e" * 64)
    assert content_key(b"model", "systolic", [], {"seed": 0}) != before


def test_a_batch_recomputes_once_apsat_changed(tmp_path, monkeypatch):
    """Run twice: the second run reuses the result. With the caller's source digest
    changed (as after editing a built-in rule), the model is computed again; the workers
    still run the unchanged source, so that result is not stored under the new key."""
    model = tmp_path / "chain.onnx"
    onnx.save(elementwise_chain(), str(model))
    store = ResultStore(tmp_path)

    def run():
        return run_local([Task("chain", str(model), out=str(tmp_path))], store=store)[0]

    first = run()
    assert first["status"] == "ok" and first["source_digest"] == source_digest() and not first["notices"]
    assert run()["status"] == "reused"
    monkeypatch.setattr(store_mod, "source_digest", lambda root=None: "f" * 64)
    again = run()
    assert again["status"] == "ok", again
    assert again["notices"] == [store_mod.OTHER_SOURCE]
    assert len(list(store.root.glob("*.json"))) == 1
    monkeypatch.undo()
    assert run()["status"] == "reused"
