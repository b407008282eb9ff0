"""apsat: equality saturation for tensor programs over Glenside-style access patterns."""
from apsat.egraph.program import Program, parse
from apsat.errors import ApsatError

__all__ = ["Program", "parse", "ApsatError"]
