"""The language: the op registry, terms, surface syntax, programs with shapes, and the reference semantics."""
