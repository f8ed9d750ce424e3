"""Linear algebra: embedding lookup (take), linear (x @ W^T + b), the rounding of a linear's input that integer
kernels do (round_activations), batched matmul."""
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
    # A linear that reads rounded activations (transform/absorb_rounding.py) says so: only an integer schedule,
    # which rounds as round_activations does, may take it (schedule checks that one did).
    attrs = {"activations": call.attrs["activations"]} if "activations" in call.attrs else None
    return emit_tir(module, "linear_bias" if has_bias else "linear", smap, ins, (Y,), body, call.args, call.ann, attrs)


register("linear", _linear_infer, _linear_ref, _linear_legalize)


# ---- round_activations: x rounded to `bits` per block of 32 along the last axis --------------
# What a linear whose kernel takes integer activations computes with: each block of 32 inputs gets the scale
# d = max|x| / (2^(bits-1) - 1) and the codes rint(x * (1 / d)) (round half to even; an all-zero block stays 0),
# as targets/c_intrin.py's quantize intrinsics do, so the reference of such a linear is
# linear(round_activations(x), W) to float32 summation order. Quantized linears emit it when their kernels
# round (quantization/base.py: activations); integer schedules absorb it into the linear that reads it
# (transform/absorb_rounding.py); where none does (cuda's prefill), it is a program of its own.

ACTIVATION_BLOCK = 32


def round_activations_np(x: np.ndarray, bits: int) -> np.ndarray:
    x = np.asarray(x, np.float32)
    b = x.reshape(-1, ACTIVATION_BLOCK)
    d = np.abs(b).max(axis=1, keepdims=True) / np.float32((1 << (bits - 1)) - 1)
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
    return (np.rint(b * inv) * d).astype(np.float32).reshape(x.shape)


def _round_infer(args, attrs):
    x = tensor(args[0], "round_activations", "x")
    if attrs.get("bits") not in (8, 16):
        raise OpError(f"round_activations: bits must be 8 or 16, got {attrs.get('bits')!r}")
    if x.dtype != "float32" or x.shape is None or not x.shape[-1].is_const or x.shape[-1].value % ACTIVATION_BLOCK:
        raise OpError(f"round_activations: x must be float32 with a last dimension that is a multiple of "
                      f"{ACTIVATION_BLOCK}")
    return args[0].ann


def _round_legalize(call, module):
    """A program of its own, where the linear that reads it does not round (transform/absorb_rounding.py: on the
    cpu target every such linear does; on cuda the decode GEMV does, and the prefill's float matmuls read this
    program's output): each block's max |x|, then every element rounded, as round_activations_np computes it."""
    smap = ShapeMap()
    X, Y = smap.buffer("x", call.args[0].ann), smap.buffer("y", call.ann)
    nb = X.shape[-1].value // ACTIVATION_BLOCK
    # one flat index over (the rows, their blocks of 32): a schedule's threads take blocks
    blocks = sym.as_expr(nb)
    for d in X.shape[:-1]:
        blocks = blocks * d
    amax = tir.Buffer("amax", (blocks,), "float32", "local")

    def at(r, e):
        """X's index of entry e of flat block r."""
        idx, rest = [sym.mod(r, nb) * ACTIVATION_BLOCK + e], sym.floordiv(r, nb)
        for d in reversed(X.shape[1:-1]):
            idx.append(sym.mod(rest, d))
            rest = sym.floordiv(rest, d)
        return (rest, *reversed(idx)) if len(X.shape) > 1 else (idx[0],)
    r, e = tir.iters("r e", (blocks, ACTIVATION_BLOCK), "SR")
    mx = Block("block_max", (r, e), Store(amax, (tir.v(r),), tir.vmax(amax[tir.v(r)], tir.unary("abs", X[at(tir.v(r), tir.v(e))]))),
               init=Store(amax, (tir.v(r),), tir.const(0.0)))
    r2, f = tir.iters("r2 f", (blocks, ACTIVATION_BLOCK))
    d = amax[tir.v(r2)] / tir.const(float((1 << (call.attrs["bits"] - 1)) - 1))
    inv = tir.select(d.cmp("gt", tir.const(0.0)), tir.const(1.0) / d, tir.const(0.0))
    idx = at(tir.v(r2), tir.v(f))
    out = Block("round", (r2, f), Store(Y, idx, tir.unary("rint", X[idx] * inv) * d))
    return emit_tir(module, "round_activations", smap, (X,), (Y,), tir.Alloc(amax, Seq((mx, out))), call.args, call.ann,
                    {"bits": call.attrs["bits"]})


# attrs: bits, and weight (the name of the module whose linear reads it; deploycc/calibrate.py measures by it)
register("round_activations", _round_infer, lambda x, bits, weight="": round_activations_np(x, bits),
         _round_legalize)


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
