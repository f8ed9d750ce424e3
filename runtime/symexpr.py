"""Symbolic integer expressions from the bytecode, compiled to closures over the shape heap.

The JSON form is int | "name" | [op, args...] with op in + * // % min max. Nothing is evaluated
as Python source: nothing in a package's JSON becomes code.
"""
from __future__ import annotations

from collections.abc import Callable

_OPS = {
    "+": lambda xs: sum(xs),
    "*": lambda xs: _prod(xs),
    "//": lambda xs: xs[0] // xs[1],
    "%": lambda xs: xs[0] % xs[1],
    "min": lambda xs: min(xs),
    "max": lambda xs: max(xs),
}


def _prod(xs):
    out = 1
    for x in xs:
        out *= x
    return out


class SymExprError(ValueError):
    pass


def compile_expr(j, slot: Callable[[str], int]) -> Callable[[list], int]:
    """`slot(name)` gives the heap index of a shape variable."""
    if isinstance(j, bool):
        raise SymExprError(f"bad symbolic expression {j!r}")
    if isinstance(j, int):
        return lambda heap: j
    if isinstance(j, str):
        i = slot(j)
        return lambda heap: heap[i]
    if isinstance(j, list) and j and j[0] in _OPS:
        op = _OPS[j[0]]
        args = [compile_expr(a, slot) for a in j[1:]]
        if j[0] == "+" and len(args) == 2:
            a, b = args
            return lambda heap: a(heap) + b(heap)
        if j[0] == "*" and len(args) == 2:
            a, b = args
            return lambda heap: a(heap) * b(heap)
        return lambda heap: op([f(heap) for f in args])
    raise SymExprError(f"bad symbolic expression {j!r}")
