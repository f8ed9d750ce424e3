"""Reductions and normalizations over the last axis: rms_norm, layer_norm, softmax."""
from __future__ import annotations

import numpy as np

from ..ir import sym, tir
from ..ir.op import register
from ..ir.tir import Alloc, Block, Buffer, Seq, Store
from ._common import OpError, ShapeMap, emit_tir, known_shape, norm_axis, same, tensor


def _check_weight(op, x, w, what="weight"):
    ws = known_shape(w, op, what)
    if len(ws) != 1 or not same(ws[0], x[-1]):
        raise OpError(f"{op}: {what} must be [{sym.to_python(x[-1])}], got "
                      f"[{', '.join(sym.to_python(d) for d in ws)}]")


def _rms_infer(args, attrs):
    x = known_shape(args[0], "rms_norm", "x")
    _check_weight("rms_norm", x, args[1])
    return args[0].ann


def _rms_ref(x, w, eps):
    var = np.mean(x * x, axis=-1, keepdims=True)
    return (w * (x / np.sqrt(var + np.float32(eps)))).astype(x.dtype)


def _row_iters(shape, extra: str | None = None, prefix="i"):
    """Iterators over all rows (every axis but the last), optionally with a last-axis iterator."""
    names = " ".join(f"{prefix}{k}" for k in range(len(shape) - 1))
    if extra is None:
        return tir.iters(names, shape[:-1]) if names else ()
    return tir.iters((names + " " + extra).strip(), shape, "S" * (len(shape) - 1) + extra[0].upper())


def _row_sum(name, X, S, value_of):
    """block: S[row] = sum_k value_of(row, k)."""
    its = _row_iters(X.shape, "r")
    idx = tuple(tir.v(it) for it in its)
    row = idx[:-1] or (sym.as_expr(0),)
    return Block(name, its, Store(S, row, S[row] + value_of(idx[:-1], idx[-1])),
                 init=Store(S, row, tir.const(0.0, S.dtype)))


def _row_buffer(name, X):
    return Buffer(name, X.shape[:-1] or (1,), X.dtype, "local")


def _rms_legalize(call, module):
    smap = ShapeMap()
    X, W = smap.buffer("x", call.args[0].ann), smap.buffer("w", call.args[1].ann)
    Y = smap.buffer("y", call.ann)
    S = _row_buffer("sumsq", X)
    h = tir.cast("float32", tir.index(X.shape[-1]))
    eps = float(call.attrs["eps"])
    reduce = _row_sum("sumsq", X, S, lambda r, k: X[r + (k,)] * X[r + (k,)])
    its = tir.iters(" ".join(f"j{k}" for k in range(len(X.shape))), X.shape)
    idx = tuple(tir.v(it) for it in its)
    row = idx[:-1] or (sym.as_expr(0),)
    norm = Block("rms_norm", its, Store(Y, idx, W[idx[-1]] * (X[idx] * tir.unary("rsqrt", S[row] / h + eps))))
    return emit_tir(module, "rms_norm", smap, (X, W), (Y,), Alloc(S, Seq((reduce, norm))), call.args, call.ann,
                    {"eps": eps})


register("rms_norm", _rms_infer, _rms_ref, _rms_legalize)


def _ln_infer(args, attrs):
    x = known_shape(args[0], "layer_norm", "x")
    _check_weight("layer_norm", x, args[1])
    _check_weight("layer_norm", x, args[2], "bias")
    return args[0].ann


def _ln_ref(x, w, b, eps):
    mean = np.mean(x, axis=-1, keepdims=True)
    var = np.mean((x - mean) ** 2, axis=-1, keepdims=True)
    return ((x - mean) / np.sqrt(var + np.float32(eps)) * w + b).astype(x.dtype)


def _ln_legalize(call, module):
    smap = ShapeMap()
    X, W, Bb = (smap.buffer(n, a.ann) for n, a in zip(("x", "w", "b"), call.args))
    Y = smap.buffer("y", call.ann)
    M, V = _row_buffer("mean", X), _row_buffer("var", X)
    h = tir.cast("float32", tir.index(X.shape[-1]))
    eps = float(call.attrs["eps"])

    def row(r):
        return r or (sym.as_expr(0),)

    sum_x = _row_sum("sum", X, M, lambda r, k: X[r + (k,)])
    sum_sq = _row_sum("sumsq", X, V, lambda r, k: (X[r + (k,)] - M[row(r)] / h) * (X[r + (k,)] - M[row(r)] / h))
    its = tir.iters(" ".join(f"j{k}" for k in range(len(X.shape))), X.shape)
    idx = tuple(tir.v(it) for it in its)
    r = row(idx[:-1])
    out = (X[idx] - M[r] / h) * tir.unary("rsqrt", V[r] / h + eps) * W[idx[-1]] + Bb[idx[-1]]
    body = Alloc(M, Alloc(V, Seq((sum_x, sum_sq, Block("layer_norm", its, Store(Y, idx, out))))))
    return emit_tir(module, "layer_norm", smap, (X, W, Bb), (Y,), body, call.args, call.ann, {"eps": eps})


register("layer_norm", _ln_infer, _ln_ref, _ln_legalize)


def _softmax_infer(args, attrs):
    x = tensor(args[0], "softmax")
    if x.shape is not None:
        norm_axis(attrs.get("axis", -1), len(x.shape), "softmax")
    return x


def _softmax_ref(x, axis=-1):
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    return (e / np.sum(e, axis=axis, keepdims=True)).astype(x.dtype)


def _softmax_legalize(call, module):
    x = call.args[0].ann
    if norm_axis(call.attrs.get("axis", -1), len(x.shape), "softmax") != len(x.shape) - 1:
        raise OpError("softmax: legalization supports the last axis only; permute first")
    smap = ShapeMap()
    X, Y = smap.buffer("x", x), smap.buffer("y", call.ann)
    Mx, Sm = _row_buffer("row_max", X), _row_buffer("row_sum", X)
    its = _row_iters(X.shape, "r")
    idx = tuple(tir.v(it) for it in its)
    row = idx[:-1] or (sym.as_expr(0),)
    mx = Block("max", its, Store(Mx, row, tir.vmax(Mx[row], X[idx])), init=Store(Mx, row, tir.const(-np.inf, X.dtype)))
    sm = _row_sum("sum_exp", X, Sm, lambda r, k: tir.unary("exp", X[r + (k,)] - Mx[r or (sym.as_expr(0),)]))
    its2 = tir.iters(" ".join(f"j{k}" for k in range(len(X.shape))), X.shape)
    idx2 = tuple(tir.v(it) for it in its2)
    r2 = idx2[:-1] or (sym.as_expr(0),)
    out = Block("softmax", its2, Store(Y, idx2, tir.unary("exp", X[idx2] - Mx[r2]) / Sm[r2]))
    body = Alloc(Mx, Alloc(Sm, Seq((mx, sm, out))))
    return emit_tir(module, "softmax", smap, (X,), (Y,), body, call.args, call.ann)


register("softmax", _softmax_infer, _softmax_ref, _softmax_legalize)
