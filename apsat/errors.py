"""Errors apsat raises. Every one carries a one-line message naming the problem."""


class ApsatError(Exception):
    """Base class: a one-line, user-facing message; never a raw egglog panic."""


class ParseError(ApsatError):
    """Program text that is not valid surface syntax (unknown op, wrong arity, bad literal)."""


class ShapeError(ApsatError):
    """A program whose access-pattern shapes do not fit together."""


class ModelError(ApsatError):
    """An ONNX model that cannot be loaded: not ONNX, invalid graph, malformed attribute."""


class RuleError(ApsatError):
    """A rule file or ruleset that cannot be used; the message starts with `path:line:`."""


class EGraphError(ApsatError):
    """egglog refused an operation (the panic text is captured, not printed)."""


class VerificationError(ApsatError):
    """An optimised program whose numbers differ from the oracle beyond tolerance."""


class UsageError(ApsatError, ValueError):
    """A public function given an argument it cannot take: an unknown method or cost-model
    name, a multi-output program where one output is meant. Also a ValueError, as these
    were before they were ApsatErrors."""


class ExtractionError(ApsatError, ValueError):
    """Extraction that cannot give a program: an e-graph file that is not extraction-gym
    JSON, a root e-class with no acyclic program (a missing child class, or a cycle), an
    unknown extractor or cost model. Also a ValueError, as it was before."""


class UnsoundRuleError(ApsatError):
    """A user rule that made a program differ from the original on the model at hand;
    the message names the rule (`file:line`), the e-class and the error."""


class CalibrationError(ApsatError):
    """A GPU calibration file (apsat/targets/gpu_calibration.py) or a set of kernel
    measurements that cannot be used; the message names the file and the problem."""


class InternalError(Exception):
    """A bug in apsat, not a problem with the input: an unexpected exception (RecursionError,
    KeyError, AssertionError, MemoryError, ...) raised while apsat ran pipeline phase
    `phase`. Its message is one line, "internal error in PHASE: TYPE: DETAIL" (DETAIL: the
    original's message on one line, at most MAX_DETAIL characters; left out with its colon
    when empty); `__cause__` is the original exception, with its traceback.

    Deliberately not an ApsatError: code that catches ApsatError to report bad input must
    not swallow apsat's own bugs, and the command line gives it its own exit status (4)."""

    MAX_DETAIL = 300

    def __init__(self, phase: str, kind: str, detail: str = ""):
        # the three parts as args, so that the exception pickles (a Dask worker's result)
        super().__init__(phase, kind, detail)
        self.phase, self.kind, self.detail = phase, kind, detail

    def __str__(self) -> str:
        return f"internal error in {self.phase}: {self.kind}" + (f": {self.detail}" if self.detail else "")

    @classmethod
    def of(cls, phase: str, error: BaseException) -> "InternalError":
        """The InternalError for `error` raised in `phase` (the caller sets __cause__ with
        `raise ... from error`)."""
        return cls(phase, type(error).__name__, one_line(error, cls.MAX_DETAIL))


def one_line(error: BaseException, limit: int = InternalError.MAX_DETAIL) -> str:
    """`error`'s message on one line (whitespace runs, newlines included, become one space),
    cut to `limit` characters with a trailing "…": RecursionError texts and huge reprs in
    KeyErrors exist, and a terminal line must stay a line."""
    try:
        text = " ".join(str(error).split())
    except Exception:          # an exception whose __str__ itself fails
        text = f"<unprintable {type(error).__name__}>"
    return text if len(text) <= limit else text[:limit - 1] + "…"


def is_internal(error: BaseException) -> bool:
    """Whether `error` is an internal error (an InternalError, or what one wraps): not an
    ApsatError (bad input, mismatch, backend failure: each has its own handling) nor one of
    the exceptions that end a run on purpose (Ctrl-C, sys.exit, a closed stdout, a closed
    generator). A BaseException such as egglog's PanicException that slipped past the
    egglog boundary counts: it is a bug all the same."""
    return not isinstance(error, (ApsatError, KeyboardInterrupt, SystemExit, GeneratorExit, BrokenPipeError))
