"""The op registry: each high-level op is defined once, with its annotation rule, numpy reference
and legalization to a tensor program (deploycc/op registers them; the IR only holds the table)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import annotation as A


@dataclass(frozen=True)
class OpDef:
    name: str
    # (arg annotations, attrs) -> result annotation; raises TypeError/ValueError on bad input.
    infer: Callable[..., A.Annotation]
    # (numpy args, attrs) -> numpy result; `ctx` gives symbolic values and runtime objects.
    reference: Callable
    # (call, builder) -> replacement expression (usually a CallTIR), or None for a runtime builtin.
    legalize: Callable | None = None
    pure: bool = True


OPS: dict[str, OpDef] = {}


def register(name: str, infer, reference, legalize=None, pure: bool = True) -> OpDef:
    if name in OPS:
        raise ValueError(f"op {name!r} registered twice")
    OPS[name] = OpDef(name, infer, reference, legalize, pure)
    return OPS[name]


def get(name: str) -> OpDef:
    try:
        return OPS[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}") from None
