"""Graph-level expressions, bindings and functions.

Nodes are frozen with identity semantics (a `Var` is itself, not its name). Every expression carries
its annotation, deduced forward when it is built (see builder.py and the op registry in op.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import annotation as A
from . import sym


class Expr:
    ann: A.Annotation


@dataclass(frozen=True, eq=False)
class Var(Expr):
    name: str
    ann: A.Annotation
    dataflow: bool = False  # defined inside a dataflow block and not visible outside it

    def __repr__(self):
        return f"%{self.name}"


@dataclass(frozen=True, eq=False)
class Constant(Expr):
    value: np.ndarray
    ann: A.Annotation = None

    def __post_init__(self):
        if self.ann is None:
            object.__setattr__(self, "ann", A.Tensor(self.value.shape, str(self.value.dtype)))


@dataclass(frozen=True, eq=False)
class ShapeExpr(Expr):
    values: tuple[sym.Expr, ...]
    ann: A.Annotation = None

    def __post_init__(self):
        object.__setattr__(self, "values", tuple(sym.as_expr(v) for v in self.values))
        if self.ann is None:
            object.__setattr__(self, "ann", A.Shape(self.values))


@dataclass(frozen=True, eq=False)
class Tuple(Expr):
    fields: tuple[Expr, ...]
    ann: A.Annotation = None

    def __post_init__(self):
        if self.ann is None:
            object.__setattr__(self, "ann", A.TupleAnn(tuple(f.ann for f in self.fields)))


@dataclass(frozen=True, eq=False)
class TupleGetItem(Expr):
    tuple_value: Expr
    index: int
    ann: A.Annotation = None

    def __post_init__(self):
        if self.ann is None:
            t = self.tuple_value.ann
            if not isinstance(t, A.TupleAnn) or not 0 <= self.index < len(t.fields):
                raise TypeError(f"tuple index {self.index} out of range for {A.to_text(t)}")
            object.__setattr__(self, "ann", t.fields[self.index])


@dataclass(frozen=True, eq=False)
class Call(Expr):
    """A call of a registered high-level op or runtime builtin, by name."""

    op: str
    args: tuple[Expr, ...]
    attrs: dict = field(default_factory=dict)
    ann: A.Annotation = None


@dataclass(frozen=True, eq=False)
class CallTIR(Expr):
    """`call_tir(program, args, out_ann, sym_args)`: destination-passing call of a tensor program.

    The output is allocated by the caller with `out_ann` (in the caller's symbolic variables);
    `sym_args` pass values for program variables that no buffer shape binds directly.
    """

    program: str
    args: tuple[Expr, ...]
    out_ann: A.Annotation
    sym_args: tuple[sym.Expr, ...] = ()
    ann: A.Annotation = None

    def __post_init__(self):
        if self.ann is None:
            object.__setattr__(self, "ann", self.out_ann)


@dataclass(frozen=True, eq=False)
class CallDPSLibrary(Expr):
    """`call_dps_library(name, args, out_ann)`: an external library function in DPS form."""

    name: str
    args: tuple[Expr, ...]
    out_ann: A.Annotation
    ann: A.Annotation = None

    def __post_init__(self):
        if self.ann is None:
            object.__setattr__(self, "ann", self.out_ann)


@dataclass(frozen=True, eq=False)
class CallPyFunc(Expr):
    """`call_py_func(func, args, out_ann)`: a call of a Python function of the module (a `PyFunc`).

    Arguments cross as torch tensors and the result must match `out_ann`. It runs where there is a
    Python host (the interpreter, deploycc.pymodule); lowering it for the VM is a compile-time error.
    """

    func: str
    args: tuple[Expr, ...]
    out_ann: A.Annotation
    ann: A.Annotation = None

    def __post_init__(self):
        if self.ann is None:
            object.__setattr__(self, "ann", self.out_ann)


@dataclass(frozen=True, eq=False)
class CallFunc(Expr):
    """A call of another graph function of the module, by name."""

    func: str
    args: tuple[Expr, ...]
    ann: A.Annotation = None


@dataclass(frozen=True, eq=False)
class SeqExpr(Expr):
    blocks: tuple[BindingBlock, ...]
    result: Expr
    ann: A.Annotation = None

    def __post_init__(self):
        if self.ann is None:
            object.__setattr__(self, "ann", self.result.ann)


@dataclass(frozen=True, eq=False)
class If(Expr):
    cond: Expr
    then_branch: SeqExpr
    else_branch: SeqExpr
    ann: A.Annotation = None


# ---- bindings --------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class Binding:
    var: Var
    value: Expr


@dataclass(frozen=True, eq=False)
class MatchCast:
    """Bind `var` to `value`, checking at run time that it matches `ann`; free symbolic variables of
    `ann` that are not yet defined become defined here."""

    var: Var
    value: Expr
    ann: A.Annotation


@dataclass(frozen=True, eq=False)
class BindingBlock:
    bindings: tuple[Binding | MatchCast, ...]
    dataflow: bool = False


@dataclass(frozen=True, eq=False)
class Function:
    name: str
    params: tuple[Var, ...]
    body: SeqExpr
    ret_ann: A.Annotation
    attrs: dict = field(default_factory=dict)
    # Bounds of the symbolic variables (e.g. total_len <= context_window); used by proofs and planning.
    bounds: sym.Bounds = field(default_factory=sym.Bounds)

    @property
    def ann(self):
        return A.CallableAnn(tuple(p.ann for p in self.params), self.ret_ann)


def with_body(fn: Function, body: SeqExpr, **changes: Any) -> Function:
    return Function(changes.get("name", fn.name), changes.get("params", fn.params), body,
                    changes.get("ret_ann", body.ann), changes.get("attrs", fn.attrs), fn.bounds)

