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
