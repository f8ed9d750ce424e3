"""Linear algebra: embedding lookup (take), linear (x @ W^T + b), batched matmul."""
from __future__ import annotations

import numpy as np

from ..ir import annotation as A
from ..ir import sym, tir
from ..ir.op import register
from ..ir.tir import Block, Seq, Store
from ._common import OpError, ShapeMap, emit_tir, known_shape, same, tensor

# ---- take: out[*idx, :] = table[ids[*idx], :] -----------------------------------------------

def _take_infer(args, attrs):
    table, ids = known_shape(args[0], "take", "table"), tensor(args[1], "take", "indices")
    if len(table) != 2:
        raise OpError(f"take: table must be 2-D [rows, width], got {len(table)} dims")
    if ids.dtype not in ("int32", "int64"):
        raise OpError(f"take: indices must be int32 or int64, got {ids.dtype}")
    if ids.shape is None:
        return A.Tensor(None, args[0].ann.dtype, ids.ndim + 1)
    return A.Tensor(ids.shape + (table[1],), args[0].ann.dtype)


def _take_ref(table, ids):
    if ids.size and (ids.min() < 0 or ids.max() >= table.shape[0]):
        raise IndexError(f"take: index out of range [0, {table.shape[0]})")
    return table[ids]


def _take_legalize(call, module):
    smap = ShapeMap()
    T = smap.buffer("table", call.args[0].ann)
    I = smap.buffer("ids", call.args[1].ann)
    O = smap.buffer("out", call.ann)
    its = tir.iters(" ".join(f"i{k}" for k in range(len(O.shape))), O.shape)
    idx = tuple(tir.v(it) for it in its)
    row = tir.cast("int32", I[idx[:-1]])
    body = Block("take", its, Store(O, idx, T[row, idx[-1]]))
    return emit_tir(module, "take", smap, (T, I), (O,), body, call.args, call.ann)


register("take", _take_infer, _take_ref, _take_legalize)


# ---- linear: y[..., n] = sum_k x[..., k] * w[n, k] (+ b[n]) ----------------------------------

def _linear_infer(args, attrs):
    if len(args) not in (2, 3):
        raise OpError(f"linear takes (x, weight[, bias]), got {len(args)} arguments")
    x, w = tensor(args[0], "linear", "x"), known_shape(args[1], "linear", "weight")
    if len(w) != 2:
        raise OpError(f"linear: weight must be 2-D [out, in], got {len(w)} dims")
    if x.shape is not None and not same(x.shape[-1], w[1]):
        raise OpError(f"linear: input features {sym.to_python(x.shape[-1])} do not match weight "
                      f"[{sym.to_python(w[0])}, {sym.to_python(w[1])}]")
    if len(args) == 3:
        b = known_shape(args[2], "linear", "bias")
        if len(b) != 1 or not same(b[0], w[0]):
            raise OpError(f"linear: bias must be [{sym.to_python(w[0])}]")
    if x.shape is None:
        return A.Tensor(None, x.dtype, x.ndim)
    return A.Tensor(x.shape[:-1] + (w[0],), x.dtype)


def _linear_ref(x, w, b=None):
    y = np.matmul(x, w.T)
    if b is not None:
        y = y + b
    return y.astype(x.dtype)


def _linear_legalize(call, module):
    smap = ShapeMap()
    X = smap.buffer("x", call.args[0].ann)
    W = smap.buffer("w", call.args[1].ann)
    ins = [X, W]
    has_bias = len(call.args) == 3
    Y = smap.buffer("y", call.ann)
    names = " ".join(f"i{k}" for k in range(len(Y.shape))) + " k"
    its = tir.iters(names, Y.shape + (W.shape[1],), "S" * len(Y.shape) + "R")
    idx = tuple(tir.v(it) for it in its[:-1])
    k = tir.v(its[-1])
    mm = Block("matmul", its, Store(Y, idx, Y[idx] + X[idx[:-1] + (k,)] * W[idx[-1], k]),
               init=Store(Y, idx, tir.const(0.0, Y.dtype)))
    body = mm
    if has_bias:
        B = smap.buffer("b", call.args[2].ann)
        ins.append(B)
        its2 = tir.iters(" ".join(f"j{k}" for k in range(len(Y.shape))), Y.shape)
        idx2 = tuple(tir.v(it) for it in its2)
        body = Seq((mm, Block("bias_add", its2, Store(Y, idx2, Y[idx2] + B[idx2[-1]]))))
    return emit_tir(module, "linear_bias" if has_bias else "linear", smap, ins, (Y,), body, call.args, call.ann)


register("linear", _linear_infer, _linear_ref, _linear_legalize)


# ---- matmul: [..., n, k] x [..., k, m] -> [..., n, m] (same batch dims) ---------------------

def _matmul_infer(args, attrs):
    a, b = known_shape(args[0], "matmul", "lhs"), known_shape(args[1], "matmul", "rhs")
    if len(a) < 2 or len(a) != len(b):
        raise OpError(f"matmul: operands need equal rank >= 2, got {len(a)} and {len(b)}")
    if not all(same(x, y) for x, y in zip(a[:-2], b[:-2])):
        raise OpError("matmul: batch dimensions differ")
    if not same(a[-1], b[-2]):
        raise OpError(f"matmul: inner dimensions differ: {sym.to_python(a[-1])} vs {sym.to_python(b[-2])}")
    return A.Tensor(a[:-1] + (b[-1],), args[0].ann.dtype)


def _matmul_legalize(call, module):
    smap = ShapeMap()
    Am, Bm = smap.buffer("a", call.args[0].ann), smap.buffer("b", call.args[1].ann)
    C = smap.buffer("c", call.ann)
    nd = len(C.shape)
    its = tir.iters(" ".join(f"i{k}" for k in range(nd)) + " k", C.shape + (Am.shape[-1],), "S" * nd + "R")
    idx = tuple(tir.v(it) for it in its[:-1])
    k = tir.v(its[-1])
    body = Block("matmul", its, Store(C, idx, C[idx] + Am[idx[:-1] + (k,)] * Bm[idx[:-2] + (k, idx[-1])]),
                 init=Store(C, idx, tir.const(0.0, C.dtype)))
    return emit_tir(module, "matmul", smap, (Am, Bm), (C,), body, call.args, call.ann)


register("matmul", _matmul_infer, lambda a, b: np.matmul(a, b).astype(a.dtype), _matmul_legalize)
