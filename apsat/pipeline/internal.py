"""Internal errors: what apsat does when its own code fails (a bug, not bad input).

An unexpected exception inside the pipeline (RecursionError, KeyError, AssertionError,
MemoryError, ...) becomes an apsat.errors.InternalError naming the phase that was running
(`PhaseTracker` remembers it); the command line and the batch runner turn it into one line,
"internal error in PHASE: TYPE: MESSAGE (traceback: PATH)", with the full traceback written
to a file (`internal_failure`): the model's report directory, or, where there is none or it
cannot be written, a new file under platformdirs' user log directory (on Linux
~/.local/state/apsat/log/), failing that the system's temporary directory.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

from apsat.errors import InternalError, one_line

TRACEBACK_FILE = "traceback.txt"


class PhaseTracker:
    """A progress callback that remembers the phase it was last told (`phase`), passing
    each one on to `progress`; `phase` starts as `start` (what runs before the first phase
    is told: option checks, setup)."""

    def __init__(self, progress=None, start: str = "setup"):
        self.progress, self.phase = progress, start

    def __call__(self, phase: str) -> None:
        self.phase = phase
        if self.progress is not None:
            self.progress(phase)


def as_internal(error: BaseException, phase: str) -> InternalError:
    """`error` as an InternalError: itself when it is one (it names its own phase), else
    one for `phase` whose __cause__ is `error`."""
    if isinstance(error, InternalError):
        return error
    wrapped = InternalError.of(phase, error)
    wrapped.__cause__ = error
    return wrapped


def internal_failure(error: BaseException, phase: str, directory=None) -> dict:
    """The record of an internal error: "phase", "type", "message" (one line, cut) and
    "traceback" (where the full traceback went: `write_traceback`), and "error", the line
    to show: "internal error in PHASE: TYPE: MESSAGE (traceback: PATH)". `error` is the
    exception caught (an InternalError keeps its own phase); `phase` is the one that was
    running where it is not."""
    wrapped = as_internal(error, phase)
    where = write_traceback(error, directory)
    return {"phase": wrapped.phase, "type": wrapped.kind, "message": wrapped.detail, "traceback": where,
            "error": f"{wrapped} (traceback: {where})"}


def write_traceback(error: BaseException, directory=None) -> str:
    """Write `error`'s full traceback (its cause chain included: an InternalError's original
    exception with every frame) with a header naming apsat's version, Python and the
    command line; returns the file's path. Into `directory/traceback.txt` when a directory
    is given and writable, else a new file in the user log directory, else in the
    temporary directory; when nothing can be written, a short reason instead of a path."""
    try:
        text = _header() + "".join(traceback.format_exception(error))
    except Exception as e:      # out of memory again, or a frame that cannot be rendered
        text = f"{type(error).__name__}: {one_line(error)}\n(the traceback could not be formatted: {e!r})\n"
    if directory is not None:
        try:
            folder = Path(directory)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / TRACEBACK_FILE).write_text(text)
            return str(folder / TRACEBACK_FILE)
        except OSError:
            pass         # an unwritable output directory: the log directory still serves
    for folder in _fallback_dirs():
        try:
            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd, path = tempfile.mkstemp(dir=folder, prefix=time.strftime("traceback-%Y%m%d-%H%M%S-"),
                                        suffix=".txt")
            with os.fdopen(fd, "w") as f:
                f.write(text)
            return path
        except OSError:
            continue
    return "not written: no writable directory"


def _fallback_dirs() -> list[Path]:
    """Where a traceback goes when there is no output directory: the user log directory
    (platformdirs), then the temporary directory."""
    dirs = []
    try:
        import platformdirs

        dirs.append(Path(platformdirs.user_log_dir("apsat")))
    except Exception:       # platformdirs missing or unable to find a home: the temp dir serves
        pass
    return dirs + [Path(tempfile.gettempdir())]


def _header() -> str:
    """The lines above a written traceback: what ran, so that a bug report is whole."""
    from apsat.pipeline.store import apsat_version

    return (f"apsat {apsat_version()}, Python {sys.version.split()[0]}, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n"
            f"command: {' '.join(sys.argv)}\n\n")
