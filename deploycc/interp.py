"""The reference interpreter: runs an IRModule at any pipeline stage on numpy.

Graph-level op calls run their op's numpy reference; `call_tir` runs the tensor program through the
loop-level interpreter (deploycc.ir.tir_interp). It is the oracle for every pass and every kernel.
`call_py_func` calls a Python function of the module with torch tensors (deploycc.pymodule).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .ir import annotation as A
from .ir import op as op_registry
from .ir import sym
from .ir.expr import (
    Call,
    CallDPSLibrary,
    CallFunc,
    CallPyFunc,
    CallTIR,
    Constant,
    Expr,
    Function,
    If,
    MatchCast,
    SeqExpr,
    ShapeExpr,
    Tuple,
    TupleGetItem,
    Var,
)
from .ir.module import IRModule, PyFunc
from .ir.tir_interp import NP_DTYPES, run_program


class MatchCastError(ValueError):
    """A value did not match the annotation a match_cast or a function signature asked for."""


# Library functions callable with call_dps_library, by name: (inputs..., outputs...) -> None.
LIBRARY: dict[str, Callable[..., None]] = {}


def match(ann: A.Annotation, value: Any, env: dict, what: str) -> None:
    """Check `value` against `ann`, binding symbolic variables not yet in `env` (Relax match_cast)."""
    if isinstance(ann, A.ObjectAnn):
        return
    if isinstance(ann, A.TensorAnn):
        if not isinstance(value, np.ndarray):
            raise MatchCastError(f"{what}: expected a tensor, got {type(value).__name__}")
        if ann.dtype and value.dtype != NP_DTYPES[ann.dtype]:
            raise MatchCastError(f"{what}: expected dtype {ann.dtype}, got {value.dtype}")
        if ann.ndim >= 0 and value.ndim != ann.ndim:
            raise MatchCastError(f"{what}: expected {ann.ndim} dims, got shape {value.shape}")
        if ann.shape is not None:
            _match_dims(ann.shape, value.shape, env, what)
        return
    if isinstance(ann, A.ShapeAnn):
        if not isinstance(value, tuple):
            raise MatchCastError(f"{what}: expected a shape, got {type(value).__name__}")
        if ann.ndim >= 0 and len(value) != ann.ndim:
            raise MatchCastError(f"{what}: expected {ann.ndim} values, got {value}")
        if ann.values is not None:
            _match_dims(ann.values, value, env, what)
        return
    if isinstance(ann, A.TupleAnn):
        if not isinstance(value, tuple) or len(value) != len(ann.fields):
            raise MatchCastError(f"{what}: expected a tuple of {len(ann.fields)}")
        for i, (f, v) in enumerate(zip(ann.fields, value)):
            match(f, v, env, f"{what}[{i}]")


def _bind_vars(ann: A.Annotation, value: Any, env: dict) -> None:
    dims = ann.shape if isinstance(ann, A.TensorAnn) else ann.values if isinstance(ann, A.ShapeAnn) else None
    actual = value.shape if isinstance(value, np.ndarray) else value if isinstance(value, tuple) else None
    if dims is None or actual is None or len(dims) != len(actual):
        return
    for d, n in zip(dims, actual):
        v = d.as_var
        if v is not None and v not in env:
            env[v] = int(n)


def _match_dims(dims: Sequence[sym.Expr], actual: Sequence[int], env: dict, what: str) -> None:
    # First bind the dims that are a bare new variable, then check every dim (including expressions).
    for d, n in zip(dims, actual):
        v = d.as_var
        if v is not None and v not in env:
            env[v] = int(n)
    for d, n in zip(dims, actual):
        try:
            want = sym.evaluate(d, env)
        except KeyError as e:
            raise MatchCastError(f"{what}: {e.args[0]}") from None
        if want != n:
            raise MatchCastError(f"{what}: dimension {sym.to_python(d)} = {want}, but the value has {n} "
                                 f"(shape {tuple(actual)})")


class Interpreter:
    def __init__(self, module: IRModule, library: Mapping[str, Callable] | None = None,
                 run_program: Callable = run_program, call_py_func: Callable | None = None,
                 ops: Mapping[str, Callable] | None = None, keep_weights: bool = False):
        """`run_program(prog, arrays, sym_args)` runs one tensor program in place: the loop-level
        interpreter by default, or compiled kernels on a device (deploycc.kernel_runner.KernelRunner).
        `call_py_func(name, args)` runs a Python function on numpy arguments and returns numpy values:
        by default the module's `PyFunc.fn` called with torch tensors (a BasePyModule instance passes
        its own, which binds `self`). `ops`: op name -> a numpy function run instead of the op's reference
        (deploycc/verify.py's noise model). keep_weights: a dequantize program (attrs op=dequantize) run on the
        same arrays again returns what it returned the first time (a session's weights do not change; the
        dequantized weights of a 135M model take 0.5 GB, and a step no longer spends seconds unpacking them)."""
        self.module = module
        self.library = dict(LIBRARY, **(library or {}))
        self.run_program = run_program
        self.call_py_func = call_py_func or self._call_module_py_func
        self.ops = dict(ops or {})
        self.weights: dict | None = {} if keep_weights else None

    def run(self, name: str, *args: Any) -> Any:
        fn = self.module[name]
        if not isinstance(fn, Function):
            raise TypeError(f"{name} is not a graph function")
        return self.call_function(fn, list(args))

    def call_function(self, fn: Function, args: list) -> Any:
        if len(args) != len(fn.params):
            raise TypeError(f"{fn.name} takes {len(fn.params)} arguments, got {len(args)}")
        env: dict = {}
        values: dict[Var, Any] = {}
        # Parameters are matched together: a variable may be defined by a later parameter (the
        # extra shape parameter) and used in an expression of an earlier one.
        for p, a in zip(fn.params, args):
            _bind_vars(p.ann, a, env)
        for p, a in zip(fn.params, args):
            match(p.ann, a, env, f"{fn.name}: argument {p.name}")
            values[p] = a
        return self.seq(fn.body, values, env)

    def seq(self, body: SeqExpr, values: dict, env: dict) -> Any:
        for block in body.blocks:
            for b in block.bindings:
                v = self.eval(b.value, values, env)
                if isinstance(b, MatchCast):
                    match(b.ann, v, env, f"match_cast of {b.var.name}")
                values[b.var] = v
        return self.eval(body.result, values, env)

    def eval(self, e: Expr, values: dict, env: dict) -> Any:
        if isinstance(e, Var):
            return values[e]
        if isinstance(e, Constant):
            return e.value
        if isinstance(e, ShapeExpr):
            return tuple(int(sym.evaluate(v, env)) for v in e.values)
        if isinstance(e, Tuple):
            return tuple(self.eval(f, values, env) for f in e.fields)
        if isinstance(e, TupleGetItem):
            return self.eval(e.tuple_value, values, env)[e.index]
        if isinstance(e, Call):
            args = [self.eval(a, values, env) for a in e.args]
            return self.ops.get(e.op, op_registry.get(e.op).reference)(*args, **e.attrs)
        if isinstance(e, CallTIR):
            prog = self.module[e.program]
            ins = [self.eval(a, values, env) for a in e.args if not isinstance(a.ann, A.ShapeAnn)]
            key = (e.program, *map(id, ins))
            kept = self.weights.get(key) if self.weights is not None else None
            if kept is not None and all(a is b for a, b in zip(kept[0], ins)):
                return kept[1]
            outs = self.alloc(e.out_ann, env)
            out_list = list(outs) if isinstance(outs, tuple) else [outs]
            self.run_program(prog, ins + out_list, [int(sym.evaluate(s, env)) for s in e.sym_args])
            if self.weights is not None and prog.attrs.get("op") == "dequantize":
                self.weights[key] = (ins, outs)
            return outs
        if isinstance(e, CallDPSLibrary):
            if e.name not in self.library:
                raise KeyError(f"library function {e.name!r} is not available to the interpreter")
            ins = [self.eval(a, values, env) for a in e.args]
            outs = self.alloc(e.out_ann, env)
            self.library[e.name](*ins, *(outs if isinstance(outs, tuple) else (outs,)))
            return outs
        if isinstance(e, CallFunc):
            return self.call_function(self.module[e.func], [self.eval(a, values, env) for a in e.args])
        if isinstance(e, CallPyFunc):
            out = self.call_py_func(e.func, [self.eval(a, values, env) for a in e.args])
            match(e.out_ann, out, env, f"the result of call_py_func({e.func})")
            return out
        if isinstance(e, If):
            cond = self.eval(e.cond, values, env)
            return self.seq(e.then_branch if bool(np.asarray(cond)) else e.else_branch, dict(values), dict(env))
        raise TypeError(f"cannot evaluate {type(e).__name__}")

    def _call_module_py_func(self, name: str, args: list) -> Any:
        from .dlpack import to_numpy, to_torch  # torch is needed only when a module has Python functions

        f = self.module.functions.get(name)
        if not isinstance(f, PyFunc):
            raise KeyError(f"call_py_func: {name!r} is not a Python function of the module")
        return to_numpy(f.fn(*to_torch(tuple(args))))

    def alloc(self, ann: A.Annotation, env: dict):
        if isinstance(ann, A.TupleAnn):
            return tuple(self.alloc(f, env) for f in ann.fields)
        if not isinstance(ann, A.TensorAnn) or ann.shape is None:
            raise TypeError(f"cannot allocate an output of {A.to_text(ann)}")
        shape = tuple(int(sym.evaluate(d, env)) for d in ann.shape)
        return np.zeros(shape, NP_DTYPES[ann.dtype])
