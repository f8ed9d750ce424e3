"""Elementwise ops: broadcasting binary arithmetic, unary activations, casts."""
from __future__ import annotations

import numpy as np

from ..ir import annotation as A
from ..ir import sym, tir
from ..ir.op import register
from ..ir.tir import Block, Store
from ._common import OpError, ShapeMap, emit_tir, tensor

NP = {"float32": np.float32, "float16": np.float16, "int32": np.int32, "int64": np.int64, "bool": np.bool_}


def broadcast_shapes(a, b, op: str):
    """Numpy broadcasting on symbolic shapes: a dimension broadcasts only when it is the constant 1."""
    out = []
    for i in range(max(len(a), len(b))):
        da = a[len(a) - 1 - i] if i < len(a) else sym.as_expr(1)
        db = b[len(b) - 1 - i] if i < len(b) else sym.as_expr(1)
        if sym.prove_eq(da, db) or (db.is_const and db.value == 1):
            out.append(da)
        elif da.is_const and da.value == 1:
            out.append(db)
        else:
            raise OpError(f"{op}: shapes do not broadcast: {sym.to_python(da)} vs {sym.to_python(db)}")
    return tuple(reversed(out))


def _bcast_index(shape, out_shape, out_idx):
    """Index into a broadcast operand from the output iterators (right-aligned): a dimension of 1
    against a larger output dimension reads index 0."""
    off = len(out_idx) - len(shape)

    def one(d):
        return d.is_const and d.value == 1

    return tuple(sym.as_expr(0) if one(d) and not one(out_shape[off + k]) else out_idx[off + k]
                 for k, d in enumerate(shape))


# ---- binary ---------------------------------------------------------------------------------

BINARY = {"add": ("add", np.add), "subtract": ("sub", np.subtract), "multiply": ("mul", np.multiply),
          "divide": ("div", np.divide), "maximum": ("max", np.maximum), "minimum": ("min", np.minimum)}


def _binary_infer(name):
    def infer(args, attrs):
        if len(args) != 2:
            raise OpError(f"{name} takes 2 tensors, got {len(args)}")
        a, b = tensor(args[0], name, "lhs"), tensor(args[1], name, "rhs")
        if a.dtype != b.dtype:
            raise OpError(f"{name}: dtype mismatch {a.dtype} vs {b.dtype}; cast one with astype")
        if a.shape is None or b.shape is None:
            return A.Tensor(None, a.dtype, max(a.ndim, b.ndim))
        return A.Tensor(broadcast_shapes(a.shape, b.shape, name), a.dtype)
    return infer


def _binary_legalize(name, vop):
    def legalize(call, module):
        a, b = (x.ann for x in call.args)
        out = call.ann
        smap = ShapeMap()
        A_, B_ = smap.buffer("A", a), smap.buffer("B", b)
        C = smap.buffer("C", out)
        its = tir.iters(" ".join(f"i{k}" for k in range(len(C.shape))), C.shape)
        idx = tuple(tir.v(it) for it in its)
        val = tir.V(vop, out.dtype, (A_[_bcast_index(A_.shape, C.shape, idx)], B_[_bcast_index(B_.shape, C.shape, idx)]))
        body = Block(name, its, Store(C, idx, val))
        return emit_tir(module, name, smap, (A_, B_), (C,), body, call.args, out)
    return legalize


for _name, (_vop, _fn) in BINARY.items():
    register(_name, _binary_infer(_name), (lambda f: lambda a, b, **_: f(a, b).astype(a.dtype))(_fn),
             _binary_legalize(_name, _vop))


# ---- unary ----------------------------------------------------------------------------------

def _silu(x: tir.V) -> tir.V:
    return x * tir.unary("sigmoid", x)


def _gelu_tanh(x: tir.V) -> tir.V:
    inner = (x + x * x * x * 0.044715) * 0.7978845608028654
    return x * 0.5 * (tir.unary("tanh", inner) + 1.0)


def _np_gelu_tanh(x):
    return (0.5 * x * (1.0 + np.tanh(np.float32(0.7978845608028654) * (x + np.float32(0.044715) * x * x * x)))).astype(x.dtype)


UNARY = {
    "silu": (_silu, lambda x: (x / (1 + np.exp(-x))).astype(x.dtype)),
    "gelu_tanh": (_gelu_tanh, _np_gelu_tanh),
    "exp": (lambda x: tir.unary("exp", x), np.exp),
    "sqrt": (lambda x: tir.unary("sqrt", x), np.sqrt),
    "rsqrt": (lambda x: tir.unary("rsqrt", x), lambda x: (1 / np.sqrt(x)).astype(x.dtype)),
    "tanh": (lambda x: tir.unary("tanh", x), np.tanh),
    "sigmoid": (lambda x: tir.unary("sigmoid", x), lambda x: (1 / (1 + np.exp(-x))).astype(x.dtype)),
    "negative": (lambda x: -x, np.negative),
}


def _unary_infer(name):
    def infer(args, attrs):
        if len(args) != 1:
            raise OpError(f"{name} takes 1 tensor, got {len(args)}")
        return tensor(args[0], name)
    return infer


def _map_legalize(name, fn, out_dtype=None):
    def legalize(call, module):
        x = call.args[0].ann
        smap = ShapeMap()
        X = smap.buffer("X", x)
        Y = smap.buffer("Y", call.ann)
        its = tir.iters(" ".join(f"i{k}" for k in range(len(X.shape))), X.shape)
        idx = tuple(tir.v(it) for it in its)
        body = Block(name, its, Store(Y, idx, fn(X[idx])))
        return emit_tir(module, name, smap, (X,), (Y,), body, call.args, call.ann)
    return legalize


for _name, (_tfn, _nfn) in UNARY.items():
    register(_name, _unary_infer(_name), (lambda f: lambda x, **_: f(x))(_nfn), _map_legalize(_name, _tfn))


# ---- cast -----------------------------------------------------------------------------------

def _astype_infer(args, attrs):
    x = tensor(args[0], "astype")
    dtype = attrs.get("dtype")
    if dtype not in A.DTYPES:
        raise OpError(f"astype: unknown dtype {dtype!r}")
    return A.TensorAnn(x.shape, dtype, x.ndim)


register("astype", _astype_infer, lambda x, dtype: x.astype(NP[dtype]),
         lambda call, module: _map_legalize("astype", lambda v: tir.cast(call.attrs["dtype"], v))(call, module))

