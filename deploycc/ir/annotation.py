"""Annotations (Relax's struct info): what is known statically about a graph-level value."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from . import sym
from .sym import Expr, IntLike

DTYPES = ("float32", "float16", "bfloat16", "int32", "int64", "uint32", "uint8", "int8", "int16", "bool")


class Annotation:
    def free_vars(self) -> set[sym.SymVar]:
        return set()


@dataclass(frozen=True)
class TensorAnn(Annotation):
    """A tensor. `shape` entries are symbolic expressions; `shape is None` means only `ndim` is known
    (ndim -1: not even that). `dtype` "" means unknown."""

    shape: tuple[Expr, ...] | None
    dtype: str
    ndim: int = -1

    def __post_init__(self):
        if self.shape is not None:
            object.__setattr__(self, "shape", tuple(sym.as_expr(s) for s in self.shape))
            object.__setattr__(self, "ndim", len(self.shape))
        if self.dtype and self.dtype not in DTYPES:
            raise ValueError(f"unknown dtype {self.dtype!r}")

    def free_vars(self):
        out: set[sym.SymVar] = set()
        for s in self.shape or ():
            out |= s.free_vars()
        return out


def Tensor(shape: Sequence[IntLike] | None = None, dtype: str = "float32", ndim: int = -1) -> TensorAnn:
    return TensorAnn(None if shape is None else tuple(sym.as_expr(s) for s in shape), dtype, ndim)


@dataclass(frozen=True)
class ShapeAnn(Annotation):
    values: tuple[Expr, ...] | None
    ndim: int = -1

    def __post_init__(self):
        if self.values is not None:
            object.__setattr__(self, "values", tuple(sym.as_expr(s) for s in self.values))
            object.__setattr__(self, "ndim", len(self.values))

    def free_vars(self):
        out: set[sym.SymVar] = set()
        for s in self.values or ():
            out |= s.free_vars()
        return out


def Shape(values: Sequence[IntLike] | None = None, ndim: int = -1) -> ShapeAnn:
    return ShapeAnn(None if values is None else tuple(sym.as_expr(v) for v in values), ndim)


@dataclass(frozen=True)
class TupleAnn(Annotation):
    fields: tuple[Annotation, ...]

    def free_vars(self):
        out: set[sym.SymVar] = set()
        for f in self.fields:
            out |= f.free_vars()
        return out


@dataclass(frozen=True)
class ObjectAnn(Annotation):
    """An opaque runtime object (the KV cache)."""


@dataclass(frozen=True)
class CallableAnn(Annotation):
    params: tuple[Annotation, ...] | None
    ret: Annotation


Object = ObjectAnn()


def is_base_of(base: Annotation, derived: Annotation, bounds: sym.Bounds | None = None) -> bool:
    """Whether every value described by `derived` is also described by `base` (proved statically)."""
    if isinstance(base, ObjectAnn):
        return True
    if type(base) is not type(derived):
        return False
    if isinstance(base, TensorAnn):
        if base.dtype and base.dtype != derived.dtype:
            return False
        if base.ndim >= 0 and base.ndim != derived.ndim:
            return False
        if base.shape is not None:
            return derived.shape is not None and all(sym.prove_eq(a, b) for a, b in zip(base.shape, derived.shape))
        return True
    if isinstance(base, ShapeAnn):
        if base.ndim >= 0 and base.ndim != derived.ndim:
            return False
        if base.values is not None:
            return derived.values is not None and all(sym.prove_eq(a, b) for a, b in zip(base.values, derived.values))
        return True
    if isinstance(base, TupleAnn):
        return len(base.fields) == len(derived.fields) and all(
            is_base_of(a, b, bounds) for a, b in zip(base.fields, derived.fields))
    if isinstance(base, CallableAnn):
        return True
    return base == derived


def substitute(ann: Annotation, mapping) -> Annotation:
    if isinstance(ann, TensorAnn) and ann.shape is not None:
        return TensorAnn(tuple(sym.substitute(s, mapping) for s in ann.shape), ann.dtype)
    if isinstance(ann, ShapeAnn) and ann.values is not None:
        return ShapeAnn(tuple(sym.substitute(s, mapping) for s in ann.values))
    if isinstance(ann, TupleAnn):
        return TupleAnn(tuple(substitute(f, mapping) for f in ann.fields))
    return ann


def to_text(ann: Annotation) -> str:
    if isinstance(ann, TensorAnn):
        dt = f'"{ann.dtype}"' if ann.dtype else '""'
        if ann.shape is not None:
            return f"Tensor(({', '.join(sym.to_python(s) for s in ann.shape)}{',' if len(ann.shape) == 1 else ''}), {dt})"
        return f"Tensor(ndim={ann.ndim}, dtype={dt})"
    if isinstance(ann, ShapeAnn):
        if ann.values is not None:
            return f"Shape([{', '.join(sym.to_python(s) for s in ann.values)}])"
        return f"Shape(ndim={ann.ndim})"
    if isinstance(ann, TupleAnn):
        return f"Tuple[{', '.join(to_text(f) for f in ann.fields)}]"
    if isinstance(ann, ObjectAnn):
        return "Object"
    if isinstance(ann, CallableAnn):
        return "Callable"
    return repr(ann)
