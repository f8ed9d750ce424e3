"""Functional ops on nn Tensors; each emits one high-level op call into the function being traced."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..ir.expr import Call, ShapeExpr
from .core import Parameter, Tensor, _tracer, _window_cap, as_tensor, call, const, shape_expr


def shape(*values) -> ShapeExpr:
    return shape_expr(*values)


def add(a, b): return call("add", a, b)
def subtract(a, b): return call("subtract", a, b)
def multiply(a, b): return call("multiply", a, b)
def divide(a, b): return call("divide", a, b)
def silu(x): return call("silu", x)
def gelu_tanh(x): return call("gelu_tanh", x)
def tanh(x): return call("tanh", x)
def softmax(x, axis: int = -1): return call("softmax", x, axis=axis)
def take(table, ids): return call("take", table, ids)
def matmul(a, b): return call("matmul", a, b)
def rms_norm(x, weight, eps: float): return call("rms_norm", x, weight, eps=float(eps))
def layer_norm(x, weight, bias, eps: float): return call("layer_norm", x, weight, bias, eps=float(eps))
def permute_dims(x, axes: Sequence[int]): return call("permute_dims", x, axes=tuple(axes))


def linear(x, weight, bias=None):
    """x @ weight^T + bias. A quantized weight whose kernels take integer activations (quantization/base.py:
    `activations` bits) has its input rounded as those kernels round it, first (op/linalg.py round_activations)."""
    bits = getattr(weight, "activations", None)
    if bits:
        x = call("round_activations", x, bits=bits, weight=getattr(weight, "site", ""))
    return call("linear", x, weight) if bias is None else call("linear", x, weight, bias)


def reshape(x, new_shape: Sequence) -> Tensor:
    return call("reshape", x, shape(*new_shape))


def concat(xs: Sequence, axis: int = 0) -> Tensor:
    return call("concat", *xs, axis=axis)


def split(x, sizes: Sequence[int], axis: int = 0) -> list[Tensor]:
    t = call("split", x, sizes=tuple(int(s) for s in sizes), axis=axis)
    return [t[i] for i in range(len(sizes))]


def strided_slice(x, begin, end, axis: int = 0) -> Tensor:
    return call("strided_slice", x, shape(begin, end), axis=axis)


def arange(tracer_of: Tensor, start, end, dtype: str = "int32") -> Tensor:
    tracer = _tracer(tracer_of)
    return tracer.emit(Call("arange", (shape(start, end),), {"dtype": dtype}), "arange")


def rope(x, inv_freq: np.ndarray, offset) -> Tensor:
    tracer = _tracer(x)
    return call("rope", x, const(np.asarray(inv_freq, np.float32), tracer), shape(offset))


def rope_table(x, inv_freq: np.ndarray, offset, scale: float = 1.0) -> Tensor:
    """[n, len(inv_freq), 2] for the n positions of x [..., n, hidden] from `offset` on (or at the positions of
    an int32 tensor [n]): cos and sin of position * inv_freq, times `scale` (YaRN's and LongRoPE's attention
    factor), for rope_apply."""
    x = as_tensor(x)
    extra = {"scale": float(scale)} if scale != 1.0 else {}
    at = offset if isinstance(offset, Tensor) else shape(offset, x.shape[-2])
    return call("rope_table", const(np.asarray(inv_freq, np.float32), _tracer(x)), at, **extra)


def rope_apply(x, table) -> Tensor:
    return call("rope_apply", x, table)


def attention(q, k, v, scale: float, window: int = 0, softcap: float = 0.0, total=None) -> Tensor:
    """Causal attention; `window` > 0 keeps the `window` most recent keys, `softcap` > 0 caps scores;
    `total` (the key count) where k and v are a ring cache (position j at row j % rows)."""
    extra = _window_cap(window, softcap)
    if total is not None:
        return call("attention", q, k, v, shape(total), scale=float(scale), **extra)
    return call("attention", q, k, v, scale=float(scale), **extra)


__all__ = ["Parameter", "add", "subtract", "multiply", "divide", "silu", "gelu_tanh", "tanh", "softmax", "take", "matmul",
           "rms_norm", "layer_norm", "permute_dims", "linear", "reshape", "concat", "split", "strided_slice",
           "arange", "rope", "rope_table", "rope_apply", "attention", "shape", "call"]
