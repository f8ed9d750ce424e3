"""Passes: pure IRModule -> IRModule functions, one per file, named with verbs."""
from .legalize import legalize

__all__ = ["legalize"]
