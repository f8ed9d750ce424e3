"""Shared helpers for op definitions: annotation checks and legalization to tensor programs.

Legalization makes programs generic in their shapes: each distinct non-constant dimension of the
call becomes one program variable, bound at run time from the buffer shapes, so one program serves
every sequence length (and identical programs are shared through `IRModule.add_program`).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from ..ir import annotation as A
from ..ir import sym
from ..ir.expr import CallTIR, Expr, ShapeExpr
from ..ir.module import IRModule
from ..ir.tir import Buffer, Stmt, TensorProgram


class OpError(TypeError):
    """A call whose arguments do not fit the op; the message says which and how."""


def tensor(e: Expr, op: str, what: str = "argument") -> A.TensorAnn:
    ann = e.ann
    if not isinstance(ann, A.TensorAnn):
        raise OpError(f"{op}: {what} must be a tensor, got {A.to_text(ann)}")
    return ann


def known_shape(e: Expr, op: str, what: str = "argument") -> tuple[sym.Expr, ...]:
    ann = tensor(e, op, what)
    if ann.shape is None:
        raise OpError(f"{op}: {what} needs a known shape, got {A.to_text(ann)}")
    return ann.shape


def shape_values(e: Expr, op: str) -> tuple[sym.Expr, ...]:
    if isinstance(e, ShapeExpr):
        return e.values
    if isinstance(e.ann, A.ShapeAnn) and e.ann.values is not None:
        return e.ann.values
    raise OpError(f"{op}: expected a shape, got {A.to_text(e.ann)}")


def same(a: sym.Expr, b: sym.Expr) -> bool:
    return sym.prove_eq(a, b)


def norm_axis(axis: int, ndim: int, op: str) -> int:
    if not -ndim <= axis < ndim:
        raise OpError(f"{op}: axis {axis} out of range for {ndim} dims")
    return axis % ndim


class ShapeMap:
    """Caller dimension expressions -> program dimensions (constants stay constants)."""

    def __init__(self):
        self.map: dict[sym.Expr, sym.Expr] = {}
        self.vars: list[tuple[sym.SymVar, sym.Expr]] = []

    def dim(self, e: sym.Expr) -> sym.Expr:
        e = sym.as_expr(e)
        if e.is_const:
            return e
        if e not in self.map:
            caller_var = e.as_var
            name = caller_var.name if caller_var is not None else f"d{len(self.vars)}"
            v = sym.SymVar(name)
            self.map[e] = sym.as_expr(v)
            self.vars.append((v, e))
        return self.map[e]

    def dims(self, shape: Sequence[sym.Expr]) -> tuple[sym.Expr, ...]:
        return tuple(self.dim(s) for s in shape)

    def buffer(self, name: str, ann: A.TensorAnn) -> Buffer:
        return Buffer(name, self.dims(ann.shape), ann.dtype)


def emit_tir(module: IRModule, name: str, smap: ShapeMap, inputs: Sequence[Buffer], outputs: Sequence[Buffer],
             body: Stmt, args: Sequence[Expr], out_ann: A.Annotation, attrs: dict | None = None) -> CallTIR:
    """Add the program to the module and return the call_tir that replaces the op call.

    Program variables that no buffer dimension binds by itself become explicit symbolic params,
    passed from the caller as `sym_args` (Relax's extra shape arguments)."""
    params = tuple(inputs) + tuple(outputs)
    attrs = {"op": name, **(attrs or {})}  # the op it came from: schedules may have a rule for it
    prog = TensorProgram(name, params, body, (), len(outputs), attrs)
    bound = set(prog.shape_vars())
    extra = [(v, caller) for v, caller in smap.vars if v not in bound]
    if extra:
        prog = TensorProgram(name, params, body, tuple(v for v, _ in extra), len(outputs), attrs)
    gname = module.add_program(prog)
    return CallTIR(gname, tuple(args), out_ann, tuple(c for _, c in extra))


Legalizer = Callable[[Expr, IRModule], Expr]
