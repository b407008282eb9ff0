"""The boundary with egglog: stderr capture and error translation.

egglog's Rust core prints panic text straight to file descriptor 2 even when Python
catches the `PanicException`, and that exception is a `BaseException`, so an ordinary
`except Exception` lets it through. Every egglog call in apsat goes through `egglog_call` (or
sits inside `captured_stderr`) so users see one-line `EGraphError`s and nothing else.
Set APSAT_EGGLOG_DEBUG=1 to have the captured stderr re-emitted.
"""
from __future__ import annotations

import atexit
import contextlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Iterator

from egglog.bindings import EggSmolError

from apsat.errors import EGraphError

_MAX_MESSAGE = 300
# The language's egglog files, in load order: declarations and the shape store first, then
# the per-op shape rules that use them.
LANGUAGE_FILES = tuple(Path(__file__).resolve().parents[1] / "lang" / n for n in ("language.egg", "shape_rules.egg"))
_depth = 0  # nesting level of captured_stderr (egglog is single-threaded here)


class Captured:
    """What egglog wrote to fd 2 inside one `captured_stderr` block (`text`, after exit)."""

    text: str = ""


@contextlib.contextmanager
def captured_stderr() -> Iterator[Captured]:
    """Redirect file descriptor 2 to a temporary file for the block; nested use is fine.

    Contract: on exit fd 2 is restored and `Captured.text` holds what was written; the
    text is re-emitted on the real stderr only when APSAT_EGGLOG_DEBUG is set. A capture
    inside a capture does nothing (the outer one holds the text). One temporary file per
    process serves every capture, emptied before each: a large model makes thousands of
    egglog calls, and a file made and removed for each cost 0.1 ms apiece."""
    global _depth
    cap = Captured()
    if _depth:
        yield cap
        return
    sys.stderr.flush()
    _depth += 1
    tmp = _capture_file()
    tmp.seek(0)
    tmp.truncate()
    saved = os.dup(2)
    os.dup2(tmp.fileno(), 2)
    try:
        yield cap
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        _depth -= 1
        tmp.seek(0)
        cap.text = tmp.read().decode("utf-8", "replace")
        if cap.text and os.environ.get("APSAT_EGGLOG_DEBUG"):
            sys.stderr.write(cap.text)


_CAPTURE: dict[int, object] = {}     # process id -> its capture file (a fork gets its own)


def _capture_file():
    """This process's capture file: made on first use, closed at exit (the system removes
    it: it has no name)."""
    tmp = _CAPTURE.get(os.getpid())
    if tmp is None:
        tmp = _CAPTURE[os.getpid()] = tempfile.TemporaryFile(mode="w+b")
        atexit.register(tmp.close)
    return tmp


def one_line(text: str, limit: int = _MAX_MESSAGE) -> str:
    """Collapse whitespace (egglog messages span lines) and cut to `limit` characters."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def is_egglog_failure(exc: BaseException) -> bool:
    """True for egglog's own failures: `EggSmolError`, or a Rust `PanicException` (a
    BaseException subclass that must be caught explicitly). Interrupts, exits and Python
    errors are not."""
    return isinstance(exc, EggSmolError) or type(exc).__name__ == "PanicException"


def egglog_error(exc: BaseException, what: str) -> EGraphError:
    """An EGraphError with a one-line message: what apsat tried, then egglog's reason."""
    kind = "panic" if type(exc).__name__ == "PanicException" else "error"
    return EGraphError(one_line(f"egglog {kind} while {what}: {exc}"))


@contextlib.contextmanager
def egglog_call(what: str) -> Iterator[None]:
    """Run the block with stderr captured; an egglog failure inside (error or panic)
    becomes an EGraphError naming `what`. Python exceptions other than egglog's pass."""
    with captured_stderr():
        try:
            yield
        except BaseException as exc:  # noqa: BLE001 - PanicException is a BaseException
            if not is_egglog_failure(exc):
                raise
            raise egglog_error(exc, what) from None


def run_text(graph, text: str, what: str) -> list:
    """Parse and run egglog `text` on a bindings EGraph inside `egglog_call(what)`;
    returns egglog's outputs."""
    with egglog_call(what):
        return graph.run_program(*graph.parse_program(text))


def language_text() -> str:
    """The language's egglog text: LANGUAGE_FILES joined in load order, each file's
    `;; @generated SECTION` lines replaced by the text the op registry generates for them
    (apsat/lang/egg_gen.py: the op constructors and the operator classification)."""
    from apsat.lang.egg_gen import expand

    return "\n".join(expand(f.read_text()) for f in LANGUAGE_FILES)
