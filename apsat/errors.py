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
