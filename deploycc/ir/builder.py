"""BlockBuilder: builds graph functions binding by binding, deducing every annotation forward."""
from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager

from . import annotation as A
from . import op as op_registry
from . import sym
from .expr import (
    Binding,
    BindingBlock,
    Call,
    CallFunc,
    Expr,
    Function,
    MatchCast,
    SeqExpr,
    ShapeExpr,
    TupleGetItem,
    Var,
)
from .module import IRModule


def deduce(expr: Expr, module: IRModule | None = None) -> A.Annotation:
    """The annotation of a call, by its op's rule (or, for a graph call, the callee's signature)."""
    if isinstance(expr, Call):
        return op_registry.get(expr.op).infer(expr.args, expr.attrs)
    if isinstance(expr, CallFunc):
        if module is None or expr.func not in module:
            raise TypeError(f"call of unknown function {expr.func!r}")
        return deduce_call_func(module[expr.func], expr.args)
    return expr.ann


def deduce_call_func(fn: Function, args: Sequence[Expr]) -> A.Annotation:
    """Match the callee's parameter annotations against the arguments, binding its symbolic
    variables, and return its result annotation in the caller's terms."""
    if len(args) != len(fn.params):
        raise TypeError(f"{fn.name} takes {len(fn.params)} arguments, got {len(args)}")
    mapping: dict[sym.SymVar, sym.Expr] = {}
    for p, a in zip(fn.params, args):
        _bind(p.ann, a.ann, mapping)
    for p, a in zip(fn.params, args):
        want = A.substitute(p.ann, mapping)
        if not A.is_base_of(want, a.ann):
            raise TypeError(f"{fn.name}: argument {p.name} expects {A.to_text(want)}, got {A.to_text(a.ann)}")
    return A.substitute(fn.ret_ann, mapping)


def _bind(pattern: A.Annotation, actual: A.Annotation, mapping: dict) -> None:
    pairs: list[tuple[sym.Expr, sym.Expr]] = []
    if isinstance(pattern, A.TensorAnn) and isinstance(actual, A.TensorAnn) and pattern.shape and actual.shape:
        pairs = list(zip(pattern.shape, actual.shape))
    elif isinstance(pattern, A.ShapeAnn) and isinstance(actual, A.ShapeAnn) and pattern.values and actual.values:
        pairs = list(zip(pattern.values, actual.values))
    elif isinstance(pattern, A.TupleAnn) and isinstance(actual, A.TupleAnn):
        for p, a in zip(pattern.fields, actual.fields):
            _bind(p, a, mapping)
    for p, a in pairs:
        v = p.as_var
        if v is not None and v not in mapping:
            mapping[v] = a


class BlockBuilder:
    """Emits bindings into the current function.

    With `auto_dataflow=True` (what nn tracing uses) every maximal run of pure bindings becomes a
    dataflow block on its own, so model code never has to say where dataflow blocks begin and end.
    """

    def __init__(self, module: IRModule | None = None):
        self.module = module if module is not None else IRModule()
        self._blocks: list[BindingBlock] = []
        self._current: list = []
        self._dataflow = False
        self._auto = False
        self._names: dict[str, int] = {}
        self._fn: tuple | None = None
        self.defined_syms: set[sym.SymVar] = set()

    # ---- functions ------------------------------------------------------------------------
    @contextmanager
    def function(self, name: str, params: Sequence[Var], attrs: dict | None = None,
                 bounds: sym.Bounds | None = None, auto_dataflow: bool = False):
        self._blocks, self._current, self._names = [], [], {}
        self._auto, self._dataflow = auto_dataflow, False
        params = with_shape_param(params)
        self._fn = (name, tuple(params), attrs or {}, bounds or sym.Bounds())
        self.defined_syms = set()
        for p in params:
            self._names[p.name] = 1
            self.defined_syms |= _param_defined_syms(p.ann)
        yield self
        self._fn = None

    def finish(self, result: Expr, ret_ann: A.Annotation | None = None) -> Function:
        """Close the function with `result` and add it to the module."""
        self._flush()
        name, params, attrs, bounds = self._fn
        body = SeqExpr(tuple(self._blocks), result)
        fn = Function(name, params, body, ret_ann or result.ann, attrs, bounds)
        self.module.functions[name] = fn
        self._blocks, self._current = [], []
        return fn

    # ---- blocks ---------------------------------------------------------------------------
    @contextmanager
    def dataflow(self):
        self._flush()
        self._dataflow = True
        yield self
        self._flush()
        self._dataflow = False

    def _flush(self):
        if self._current:
            self._blocks.append(BindingBlock(tuple(self._current), self._dataflow))
            self._current = []

    def fresh_name(self, hint: str) -> str:
        hint = hint or "v"
        n = self._names.get(hint, 0)
        self._names[hint] = n + 1
        return hint if n == 0 else f"{hint}{n}"

    # ---- bindings -------------------------------------------------------------------------
    def emit(self, value: Expr, name: str = "lv") -> Var:
        if value.ann is None:
            value = _with_ann(value, deduce(value, self.module))
        pure = is_pure(value, self.module)
        if self._auto:
            if pure != self._dataflow:
                self._flush()
                self._dataflow = pure
        elif self._dataflow and not pure:
            raise TypeError(f"impure call {_callee(value)} inside a dataflow block")
        var = Var(self.fresh_name(name), value.ann, dataflow=self._dataflow and not self._auto)
        self._current.append(Binding(var, value))
        return var

    def match_cast(self, value: Expr, ann: A.Annotation, name: str = "lv") -> Var:
        if self._auto and not self._dataflow:
            pass
        var = Var(self.fresh_name(name), ann, dataflow=self._dataflow and not self._auto)
        self._current.append(MatchCast(var, value, ann))
        self.defined_syms |= ann.free_vars()
        return var

    def emit_output(self, value: Expr, name: str = "gv") -> Var:
        """Inside an explicit dataflow block: a binding visible after the block."""
        var = Var(self.fresh_name(name), value.ann if value.ann is not None else deduce(value, self.module))
        if value.ann is None:
            value = _with_ann(value, var.ann)
        self._current.append(Binding(var, value))
        return var

    def call(self, op: str, *args: Expr, name: str | None = None, **attrs) -> Var:
        call = Call(op, tuple(args), attrs)
        return self.emit(call, name or op.split(".")[-1])


def _callee(e: Expr) -> str:
    return getattr(e, "op", None) or getattr(e, "func", None) or type(e).__name__


def _with_ann(value: Expr, ann: A.Annotation) -> Expr:
    object.__setattr__(value, "ann", ann)
    return value


def is_pure(value: Expr, module: IRModule | None = None) -> bool:
    if isinstance(value, Call):
        return op_registry.get(value.op).pure
    if isinstance(value, CallFunc) and module is not None and value.func in module:
        return module[value.func].attrs.get("pure", True)
    return True


def with_shape_param(params: Sequence[Var]) -> list[Var]:
    """Relax's rule for functions whose parameter annotations use expressions (`Tensor((2*n,))`):
    a variable that no parameter dimension defines by itself is passed in an extra `Shape([...])`
    parameter, so the function can bind it at entry (as fused subgraph functions need)."""
    defined: set[sym.SymVar] = set()
    used: list[sym.SymVar] = []
    for p in params:
        defined |= _param_defined_syms(p.ann)
        for v in sorted(p.ann.free_vars(), key=lambda v: v.name):
            if v not in used:
                used.append(v)
    missing = [v for v in used if v not in defined]
    if not missing:
        return list(params)
    return list(params) + [Var("shape_args", A.Shape([sym.as_expr(v) for v in missing]))]


def _param_defined_syms(ann: A.Annotation) -> set[sym.SymVar]:
    """Variables a parameter defines: the dims that are exactly a variable (Relax's rule)."""
    out: set[sym.SymVar] = set()
    if isinstance(ann, A.TensorAnn) and ann.shape is not None:
        out |= {s.as_var for s in ann.shape if s.as_var is not None}
    elif isinstance(ann, A.ShapeAnn) and ann.values is not None:
        out |= {s.as_var for s in ann.values if s.as_var is not None}
    elif isinstance(ann, A.TupleAnn):
        for f in ann.fields:
            out |= _param_defined_syms(f)
    return out


def tuple_get(bb: BlockBuilder, t: Expr, i: int, name: str = "lv") -> Var:
    return bb.emit(TupleGetItem(t, i), name)


def shape_of(values: Sequence) -> ShapeExpr:
    return ShapeExpr(tuple(sym.as_expr(v) for v in values))
