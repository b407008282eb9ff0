"""Where apsat keeps the files it generates and then imports or loads: private folders.

The gpu backend writes a runner module, Triton kernel modules and host-step data, and
imports or reads them back. Whoever can write those files chooses the code apsat runs,
so they must be writable by the user alone: never a folder of the shared temporary
directory, where another local user could create it first. They live under
`platformdirs.user_cache_dir("apsat")`; every folder apsat creates there is mode 0700,
and one that already exists but belongs to another user or is group- or world-writable
is refused (UnsafeDirectoryError, one line). Where the cache folder cannot be created at
all (a read-only home, say), one private temporary folder per process
(tempfile.mkdtemp: 0700) stands in for it, removed at exit.

    cache_dir(*parts) -> Path           the checked folder <cache>/<parts...>, created 0700
    private_dir(path) -> Path           create (0700) or check one folder
    prune(folder, keep)                 drop all but the `keep` most recently used entries
    source_module(text, name)           context: a module run from text in a private temp folder

Files written into a folder the user names (write_kernels' DIR, --out) are not checked:
the user chose the folder, and apsat imports from it only when asked to (load_runner on
it, run_kernels(directory=...)).
"""
from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import shutil
import stat
import tempfile
from pathlib import Path

from apsat.errors import ApsatError

_FALLBACK: list[Path] = []      # this process's private temporary folder, once made


class UnsafeDirectoryError(ApsatError):
    """A folder apsat would import generated code from that someone else could write."""


def _uid() -> int | None:
    """The current user's id; None where the system has none (Windows)."""
    return os.getuid() if hasattr(os, "getuid") else None


def _refusal(st: os.stat_result, link: os.stat_result) -> str | None:
    """Why a folder (stat `st`; `link`: its lstat, the same unless a symbolic link points
    to it) is unsafe to import from, or None when it is safe."""
    uid = _uid()
    if uid is None:
        return None             # Windows: no POSIX owner or mode bits to check
    for s in (link, st):        # a link's own mode is always 0777: only its owner counts
        if s.st_uid != uid:
            return f"owned by uid {s.st_uid}, not by you (uid {uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by group or others (mode {stat.S_IMODE(st.st_mode):#o})"
    return None


def check_private(path) -> Path:
    """`path` itself, after checking that it is a folder only the current user can write:
    owned by them (the link too, where it is a symbolic link) and not group- or
    world-writable. Raises UnsafeDirectoryError naming the folder and the reason."""
    path = Path(path)
    link, st = os.lstat(path), os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirectoryError(f"{path}: not a folder; apsat keeps generated code in folders")
    why = _refusal(st, link)
    if why:
        raise UnsafeDirectoryError(f"{path}: {why}; apsat will not import generated code from it "
                                   f"(remove it, or make it yours with mode 0700)")
    return path


def private_dir(path) -> Path:
    """The folder `path`, created with mode 0700 when missing (its parent must exist), and
    checked with check_private either way; returns it."""
    path = Path(path)
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass                    # made earlier, or by a concurrent run: checked below
    return check_private(path)


def _root() -> Path:
    """The checked per-user cache folder, or this process's private temporary folder where
    the cache folder cannot be created."""
    if _FALLBACK:
        return _FALLBACK[0]
    import platformdirs

    root = Path(platformdirs.user_cache_dir("apsat"))
    try:
        root.parent.mkdir(parents=True, exist_ok=True)
        return private_dir(root)
    except OSError:             # read-only or missing home: a private folder for this run
        # (UnsafeDirectoryError is no OSError: a refused folder is never worked around)
        tmp = Path(tempfile.mkdtemp(prefix="apsat-"))
        atexit.register(shutil.rmtree, tmp, True)
        _FALLBACK.append(tmp)
        return tmp


def cache_dir(*parts: str) -> Path:
    """The folder <user cache dir>/apsat/<parts...>, each level created with mode 0700 and
    checked (check_private); raises UnsafeDirectoryError where one is unsafe."""
    path = _root()
    for part in parts:
        path = private_dir(path / part)
    return path


def prune(folder, keep: int) -> None:
    """Remove all but the `keep` most recently modified entries of `folder` (a cache
    folder apsat owns), so the cache stays bounded; entries vanishing meanwhile (another
    process pruning too) are ignored."""
    entries = []
    for p in Path(folder).iterdir():
        try:
            entries.append((p.stat().st_mtime_ns, p))
        except FileNotFoundError:
            continue
    entries.sort(reverse=True)
    for _, p in entries[keep:]:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


@contextlib.contextmanager
def source_module(text: str, name: str):
    """Context: a module executed from the source `text`, written first into a fresh
    private temporary folder that is removed on exit. A file is needed because Triton reads
    kernel source back through inspect; a private folder means no one else can swap it.
    Use the module (compile it) inside the context: source read lazily afterwards (the
    Triton interpreter's) is gone; for that, keep the files in cache_dir."""
    tmp = Path(tempfile.mkdtemp(prefix="apsat-src-"))
    try:
        path = tmp / f"{name}.py"
        path.write_text(text)
        spec = importlib.util.spec_from_file_location(f"_apsat_src_{name}_{os.getpid()}", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        yield mod
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
