"""Shape manipulation: reshape, permute_dims, concat, split, strided_slice, arange."""
from __future__ import annotations

import numpy as np

from ..ir import annotation as A
from ..ir import sym, tir
from ..ir.op import register
from ..ir.tir import Block, Seq, Store
from ._common import OpError, ShapeMap, emit_tir, known_shape, norm_axis, same, shape_values


def _prod(shape) -> sym.Expr:
    out = sym.as_expr(1)
    for d in shape:
        out = out * d
    return out


def _strides(shape):
    out, acc = [], sym.as_expr(1)
    for d in reversed(shape):
        out.append(acc)
        acc = acc * d
    return tuple(reversed(out))


def _iters(shape, prefix="i"):
    its = tir.iters(" ".join(f"{prefix}{k}" for k in range(len(shape))), shape)
    return its, tuple(tir.v(it) for it in its)


# ---- reshape --------------------------------------------------------------------------------

def _reshape_infer(args, attrs):
    x = known_shape(args[0], "reshape", "x")
    new = shape_values(args[1], "reshape")
    if not same(_prod(x), _prod(new)):
        raise OpError(f"reshape: cannot reshape ({', '.join(map(sym.to_python, x))}) to "
                      f"({', '.join(map(sym.to_python, new))}): element counts differ")
    return A.Tensor(new, args[0].ann.dtype)


def _reshape_legalize(call, module):
    smap = ShapeMap()
    X, Y = smap.buffer("x", call.args[0].ann), smap.buffer("y", call.ann)
    its, idx = _iters(Y.shape)
    flat = sum((i * s for i, s in zip(idx, _strides(Y.shape))), sym.as_expr(0))
    src = tuple((flat // s) % d for s, d in zip(_strides(X.shape), X.shape))
    body = Block("reshape", its, Store(Y, idx, X[src]))
    return emit_tir(module, "reshape", smap, (X,), (Y,), body, call.args[:1], call.ann)


register("reshape", _reshape_infer, lambda x, shape: x.reshape(shape), _reshape_legalize)


# ---- permute_dims ---------------------------------------------------------------------------

def _permute_infer(args, attrs):
    x = known_shape(args[0], "permute_dims", "x")
    axes = tuple(attrs["axes"])
    if sorted(a % len(x) for a in axes) != list(range(len(x))):
        raise OpError(f"permute_dims: axes {axes} are not a permutation of {len(x)} dims")
    return A.Tensor(tuple(x[a] for a in axes), args[0].ann.dtype)


def _permute_legalize(call, module):
    smap = ShapeMap()
    X, Y = smap.buffer("x", call.args[0].ann), smap.buffer("y", call.ann)
    axes = [a % len(X.shape) for a in call.attrs["axes"]]
    its, idx = _iters(Y.shape)
    src = [None] * len(axes)
    for out_axis, in_axis in enumerate(axes):
        src[in_axis] = idx[out_axis]
    body = Block("permute_dims", its, Store(Y, idx, X[tuple(src)]))
    return emit_tir(module, "permute_dims", smap, (X,), (Y,), body, call.args, call.ann)


register("permute_dims", _permute_infer, lambda x, axes: np.transpose(x, axes).copy(), _permute_legalize)


# ---- concat ---------------------------------------------------------------------------------

def _concat_infer(args, attrs):
    shapes = [known_shape(a, "concat", f"input {i}") for i, a in enumerate(args)]
    if not shapes:
        raise OpError("concat needs at least one tensor")
    axis = norm_axis(attrs.get("axis", 0), len(shapes[0]), "concat")
    total = sym.as_expr(0)
    for s in shapes:
        if len(s) != len(shapes[0]) or any(not same(a, b) for k, (a, b) in enumerate(zip(s, shapes[0])) if k != axis):
            raise OpError("concat: inputs must agree on every dimension but the concat axis")
        total = total + s[axis]
    out = list(shapes[0])
    out[axis] = total
    return A.Tensor(out, args[0].ann.dtype)


def _concat_legalize(call, module):
    smap = ShapeMap()
    ins = [smap.buffer(f"x{i}", a.ann) for i, a in enumerate(call.args)]
    Y = smap.buffer("y", call.ann)
    axis = norm_axis(call.attrs.get("axis", 0), len(Y.shape), "concat")
    blocks, offset = [], sym.as_expr(0)
    for i, X in enumerate(ins):
        its, idx = _iters(X.shape)
        dst = tuple(j + offset if k == axis else j for k, j in enumerate(idx))
        blocks.append(Block(f"concat{i}", its, Store(Y, dst, X[idx])))
        offset = offset + X.shape[axis]
    return emit_tir(module, "concat", smap, ins, (Y,), Seq(tuple(blocks)), call.args, call.ann)


register("concat", _concat_infer, lambda *xs, axis=0: np.concatenate(xs, axis=axis), _concat_legalize)


# ---- split: static section sizes ------------------------------------------------------------

def _split_infer(args, attrs):
    x = known_shape(args[0], "split", "x")
    axis = norm_axis(attrs.get("axis", 0), len(x), "split")
    sizes = tuple(attrs["sizes"])
    if not same(x[axis], sum(sizes)):
        raise OpError(f"split: sizes {sizes} do not add up to {sym.to_python(x[axis])}")
    return A.TupleAnn(tuple(A.Tensor(x[:axis] + (s,) + x[axis + 1:], args[0].ann.dtype) for s in sizes))


def _split_ref(x, sizes, axis=0):
    return tuple(np.split(x, np.cumsum(sizes)[:-1], axis=axis))


def _split_legalize(call, module):
    smap = ShapeMap()
    X = smap.buffer("x", call.args[0].ann)
    outs = [smap.buffer(f"y{i}", a) for i, a in enumerate(call.ann.fields)]
    axis = norm_axis(call.attrs.get("axis", 0), len(X.shape), "split")
    blocks, offset = [], 0
    for i, Y in enumerate(outs):
        its, idx = _iters(Y.shape)
        src = tuple(j + offset if k == axis else j for k, j in enumerate(idx))
        blocks.append(Block(f"split{i}", its, Store(Y, idx, X[src])))
        offset += call.attrs["sizes"][i]
    return emit_tir(module, "split", smap, (X,), outs, Seq(tuple(blocks)), call.args, call.ann)


register("split", _split_infer, _split_ref, _split_legalize)


# ---- strided_slice: x[..., begin:end, ...] on one axis, symbolic bounds ----------------------

def _slice_infer(args, attrs):
    x = known_shape(args[0], "strided_slice", "x")
    begin, end = shape_values(args[1], "strided_slice")
    axis = norm_axis(attrs.get("axis", 0), len(x), "strided_slice")
    out = list(x)
    out[axis] = end - begin
    return A.Tensor(out, args[0].ann.dtype)


def _slice_ref(x, bounds, axis=0):
    sl = [slice(None)] * x.ndim
    sl[axis] = slice(bounds[0], bounds[1])
    return x[tuple(sl)].copy()


def _slice_legalize(call, module):
    smap = ShapeMap()
    X, Y = smap.buffer("x", call.args[0].ann), smap.buffer("y", call.ann)
    axis = norm_axis(call.attrs.get("axis", 0), len(X.shape), "strided_slice")
    begin = smap.dim(shape_values(call.args[1], "strided_slice")[0])
    its, idx = _iters(Y.shape)
    src = tuple(j + begin if k == axis else j for k, j in enumerate(idx))
    body = Block("strided_slice", its, Store(Y, idx, X[src]))
    return emit_tir(module, "strided_slice", smap, (X,), (Y,), body, call.args[:1], call.ann)


register("strided_slice", _slice_infer, _slice_ref, _slice_legalize)


# ---- arange: int32 [start, end) ---------------------------------------------------------------

def _arange_infer(args, attrs):
    start, end = shape_values(args[0], "arange")
    return A.Tensor((end - start,), attrs.get("dtype", "int32"))


def _arange_legalize(call, module):
    smap = ShapeMap()
    start, _ = shape_values(call.args[0], "arange")
    Y = smap.buffer("y", call.ann)
    s = smap.dim(start)
    its, idx = _iters(Y.shape)
    body = Block("arange", its, Store(Y, idx, tir.cast(Y.dtype, tir.index(idx[0] + s))))
    return emit_tir(module, "arange", smap, (), (Y,), body, (), call.ann)


register("arange", _arange_infer, lambda b, dtype="int32": np.arange(b[0], b[1], dtype=np.dtype(dtype)),
         _arange_legalize)

