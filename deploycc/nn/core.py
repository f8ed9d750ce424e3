"""The model-building API: PyTorch-like modules whose forward methods build IR as they run.

A `Tensor` wraps a graph variable and the tracer that is building the current function, so
`x + y` or `self.q_proj(x)` emit bindings without any global state. `Module.export(spec)` traces
the named methods with spec inputs whose dimensions may be strings (symbolic variables).
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import op as _ops  # noqa: F401  (registers the ops the tracer emits)
from ..ir import annotation as A
from ..ir import sym
from ..ir.builder import BlockBuilder
from ..ir.expr import Call, Constant, Expr, ShapeExpr, Tuple, TupleGetItem, Var
from ..ir.module import IRModule
from ..runtime.kvcache import KV_META


class Tracer:
    """The state of one function being traced: its builder and its symbolic variables by name."""

    def __init__(self, bb: BlockBuilder):
        self.bb = bb
        self.symbols: dict[str, sym.Expr] = {}

    def sym(self, name: str) -> sym.Expr:
        if name not in self.symbols:
            self.symbols[name] = sym.var(name)
        return self.symbols[name]

    def dim(self, d: int | str | sym.Expr) -> sym.Expr:
        return self.sym(d) if isinstance(d, str) else sym.as_expr(d)

    def emit(self, value: Expr, name: str) -> Tensor:
        return Tensor(self.bb.emit(value, name), self)


class Tensor:
    def __init__(self, var: Expr, tracer: Tracer):
        self.var = var
        self.tracer = tracer

    @property
    def ann(self) -> A.Annotation:
        return self.var.ann

    @property
    def shape(self) -> tuple[sym.Expr, ...]:
        return self.var.ann.shape

    @property
    def dtype(self) -> str:
        return self.var.ann.dtype

    @property
    def ndim(self) -> int:
        return self.var.ann.ndim

    def _op(self, name: str, *others, **attrs) -> Tensor:
        return call(name, self, *others, **attrs)

    def __add__(self, o):
        return self._op("add", o)

    def __sub__(self, o):
        return self._op("subtract", o)

    def __mul__(self, o):
        return self._op("multiply", o)

    def __truediv__(self, o):
        return self._op("divide", o)

    def reshape(self, *shape) -> Tensor:
        return call("reshape", self, shape_expr(*(shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list))
                                                 else shape)))

    def permute(self, *axes) -> Tensor:
        return self._op("permute_dims", axes=tuple(axes))

    def astype(self, dtype: str) -> Tensor:
        return self._op("astype", dtype=dtype)

    def __getitem__(self, i: int) -> Tensor:
        return self.tracer.emit(TupleGetItem(self.var, i), "item")

    def __repr__(self):
        return f"Tensor({A.to_text(self.ann)})"


class Parameter:
    """A weight. While a function is traced, `tensor` is the function parameter bound to it."""

    def __init__(self, shape: Sequence[int], dtype: str = "float32"):
        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype
        self.tensor: Tensor | None = None

    def __repr__(self):
        return f"Parameter({self.shape}, {self.dtype})"


class Module:
    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, Parameter]]:
        for name, value in vars(self).items():
            full = f"{prefix}{name}"
            if isinstance(value, Parameter):
                yield full, value
            elif isinstance(value, Module):
                yield from value.named_parameters(full + ".")

    def parameters(self) -> list[Parameter]:
        return [p for _, p in self.named_parameters()]

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, *args, **kwargs):
        raise NotImplementedError(f"{type(self).__name__}.forward")

    def export(self, spec: dict[str, dict[str, Spec]], bounds: dict[str, int | str] | None = None,
               module: IRModule | None = None) -> tuple[IRModule, list[tuple[str, Parameter]]]:
        """Trace each method named in `spec` into a graph function of one IRModule.

        Each function takes the spec inputs followed by every parameter (Relax's "params as inputs"),
        so weights are data, not constants. `bounds` declares upper bounds of symbolic variables by
        name (`{"total_len": 2048}`), which proofs and memory planning use.
        """
        mod = module if module is not None else IRModule()
        bb = BlockBuilder(mod)
        named = list(self.named_parameters())
        for fname, inputs in spec.items():
            tracer = Tracer(bb)
            in_vars = [Var(name, s.annotation(tracer)) for name, s in inputs.items()]
            p_vars = [Var(name, A.Tensor(p.shape, p.dtype)) for name, p in named]
            for (_, p), v in zip(named, p_vars):
                p.tensor = Tensor(v, tracer)
            # Variables named in `bounds` that the trace may create later (total_len) are made now.
            bnd = sym.Bounds()
            for name, hi in (bounds or {}).items():
                bnd.declare(tracer.sym(name), lo=1, hi=tracer.dim(hi))
            try:
                with bb.function(fname, in_vars + p_vars, {"num_inputs": len(in_vars)}, bnd, auto_dataflow=True):
                    args = [Cache(v, tracer, s.capacity, s.step, s.page_size, s.pool_pages, s.dtype)
                            if isinstance(s, ObjectSpec)
                            else Tensor(v, tracer) for v, s in zip(in_vars, inputs.values())]
                    out = getattr(self, fname)(*args)
                    bb.finish(_as_expr(out))
            finally:
                for _, p in named:
                    p.tensor = None
        return mod, named


def _as_expr(out) -> Expr:
    if isinstance(out, Tensor):
        return out.var
    if isinstance(out, (tuple, list)):
        return Tuple(tuple(_as_expr(o) for o in out))
    raise TypeError(f"a traced method must return tensors, got {type(out).__name__}")


@dataclass(frozen=True)
class Spec:
    """A traced input: a tensor whose dimensions are ints or names of symbolic variables."""

    shape: tuple
    dtype: str = "float32"

    def annotation(self, tracer: Tracer) -> A.Annotation:
        return A.Tensor(tuple(tracer.dim(d) for d in self.shape), self.dtype)


@dataclass(frozen=True)
class ObjectSpec(Spec):
    shape: tuple = ()
    capacity: int = 0  # the KV cache: positions it holds (the context window) ...
    step: int = 0  # ... and the most tokens one step appends (0: unbounded, no ring caches)
    page_size: int = 0  # a page pool shared by a batch of sequences: rows per page (0: one contiguous cache) ...
    pool_pages: int = 0  # ... and the pages of the pool

    def annotation(self, tracer: Tracer) -> A.Annotation:
        return A.Object


def spec(shape: Sequence[int | str], dtype: str = "float32") -> Spec:
    return Spec(tuple(shape), dtype)


def kv_cache_spec(capacity: int = 0, step: int = 0, page_size: int = 0, pool_pages: int = 0,
                  dtype: str = "float32") -> ObjectSpec:
    """The KV cache input. With `step` (the prefill chunk) a sliding-window layer keeps a ring of
    window + step - 1 rows where that is less than `capacity`: what its queries can see in any step.
    With `page_size`, a pool of `pool_pages` pages that a batch of sequences shares (Cache). `dtype`: its
    elements' (float32, or float16: the keys and values rounded as they are appended)."""
    return ObjectSpec(dtype=dtype, capacity=capacity, step=step, page_size=page_size, pool_pages=pool_pages)


def ring_rows(window: int, step: int, capacity: int) -> int:
    """The rows of KV cache a layer with a sliding `window` keeps when a step appends at most `step` tokens
    to a cache of `capacity` positions: a step of n tokens at positions t-n..t-1 sees keys from t-n-window+1
    on, so window + n - 1 rows hold all it reads. 0 (the whole cache) where that saves nothing, or without a
    window or a bounded step."""
    if not window or not step or window + step - 1 >= capacity:
        return 0
    return window + step - 1


def _one(n) -> bool:
    """Whether a step's token count is the constant 1 (step_one: deploycc/export.py)."""
    e = sym.as_expr(n)
    return e.is_const and e.value == 1


class Cache:
    """The KV cache as seen by model code (a runtime object threaded through the function).

    Contiguous (one sequence): `begin(n)` reserves the step's n positions after the cached ones.
    Paged (a batched step, vLLM's layout): the step's tokens belong to `batch` sequences; every layer's keys
    and values live in a pool of fixed-size pages, and the runtime hands the step its metadata (kv.meta):
    each token's position, sequence and pool row (`pos`, `seq`, `slot`, [seq_len]), each sequence's page
    table (`pages`, [batch, pages_len]) and the token whose logits it returns (`last`, [batch])."""

    META = KV_META

    def __init__(self, var: Var, tracer: Tracer, capacity: int = 0, step: int = 0, page_size: int = 0,
                 pool_pages: int = 0, dtype: str = "float32"):
        self.var = var
        self.dtype = dtype  # its elements': float32, or float16 (kv.append rounds the keys and values it stores)
        self.tracer = tracer
        self.total_len: sym.Expr | None = None
        self.capacity, self.step = capacity, step
        self.page_size, self.pool_pages = page_size, pool_pages
        self.meta: dict[str, Tensor] = {}

    def rows(self, window: int) -> int:
        """The ring a layer with this sliding window keeps (0: the whole context window; a pool has no rings)."""
        return 0 if self.page_size else ring_rows(window, self.step, self.capacity)

    def begin(self, seq_len: sym.Expr) -> sym.Expr | Tensor:
        """Reserve `seq_len` positions; returns the first one's position (an offset), or in a pool each
        token's position (an int32 tensor [seq_len])."""
        bb = self.tracer.bb
        if self.page_size:
            shape = bb.emit(Call("kv.pages", (self.var,)), "kv_batch")
            width = self.tracer.sym("pages_len")
            batch = sym.as_expr(1) if _one(seq_len) else self.tracer.sym("batch")  # one token is one sequence's
            bb.match_cast(shape, A.Shape([batch, width]), "batch")
            dims = {"pos": (seq_len,), "seq": (seq_len,), "slot": (seq_len,), "pages": (batch, width), "last": (batch,)}
            for name in self.META:
                raw = bb.emit(Call("kv.meta", (self.var,), {"name": name}), f"{name}_raw")
                self.meta[name] = Tensor(bb.match_cast(raw, A.Tensor(dims[name], "int32"), name), self.tracer)
            return self.meta["pos"]
        shape = bb.emit(Call("kv.begin", (self.var, ShapeExpr((seq_len,)))), "kv_len")
        total = self.tracer.sym("total_len")
        bb.match_cast(shape, A.Shape([total]), "total")
        self.total_len = total
        return total - seq_len

    def last(self, h: Tensor) -> Tensor:
        """The rows of h [1, seq_len, hidden] whose logits a step returns: its last token, or in a pool each
        sequence's last token of the step ([1, batch, hidden])."""
        n = h.shape[1]
        if not self.page_size:
            return call("strided_slice", h, shape_expr(n - 1, n), axis=1)
        if _one(n):  # one token is its sequence's last (step_one)
            return h
        last = self.meta["last"]
        return call("take", h.reshape(n, h.shape[2]), last.reshape(1, last.shape[0]))

    def attend(self, layer: int, q: Tensor, k: Tensor, v: Tensor, scale: float, window: int = 0,
               softcap: float = 0.0) -> Tensor:
        """Append the step's keys and values of `layer` and attend to every cached one: q [n, heads, head_dim],
        k and v [n, kv_heads, head_dim]. A sliding-window layer keeps a ring (rows) where that saves memory."""
        kv_heads, head_dim = k.shape[1], k.shape[2]
        rows = self.rows(window)
        self._append(layer, k, v, rows)
        keys, values = self._view(layer, kv_heads, head_dim, rows)
        if self.page_size:
            m = self.meta
            return call("attention", q, keys, values, m["pages"], m["seq"], m["pos"], scale=float(scale),
                        page_size=self.page_size, **_window_cap(window, softcap))
        if rows:  # a ring: attention is told the key count
            return call("attention", q, keys, values, shape_expr(self.total_len), scale=float(scale),
                        **_window_cap(window, softcap))
        return call("attention", q, keys, values, scale=float(scale), **_window_cap(window, softcap))

    def _append(self, layer: int, k: Tensor, v: Tensor, rows: int = 0) -> None:
        """Write the step's keys and values: at positions total_len - n .. total_len - 1, in a ring of
        `rows` rows (position j at row j % rows), or in a pool at the rows `slot`."""
        args = (self.var, k.var, v.var) + ((self.meta["slot"].var,) if self.page_size else ())
        attrs = {"layer": layer, **({"rows": rows} if rows else {}), **self._typed()}
        self.var = self.tracer.bb.emit(Call("kv.append", args, attrs), "cache")

    def _typed(self) -> dict:
        """The cache's element type as kv.append's and kv.keys'/kv.values' attribute (float32 says nothing)."""
        return {"dtype": self.dtype} if self.dtype != "float32" else {}

    def _view(self, layer: int, kv_heads, head_dim, rows: int = 0) -> tuple[Tensor, Tensor]:
        """This layer's cached keys and values, `[total_len, kv_heads, head_dim]` each, its whole ring
        `[rows, kv_heads, head_dim]` (attention reads position j from row j % rows), or its pool
        `[pool_pages * page_size, kv_heads, head_dim]`."""
        bb = self.tracer.bb
        out = []
        attrs = {"layer": layer, **({"rows": rows} if rows else {}), **self._typed()}
        length = self.pool_pages * self.page_size if self.page_size else rows or self.total_len
        for which in ("keys", "values"):
            raw = bb.emit(Call(f"kv.{which}", (self.var,), attrs), f"{which[0]}_raw")
            ann = A.Tensor((length, kv_heads, head_dim), self.dtype)
            out.append(Tensor(bb.match_cast(raw, ann, f"{which[0]}_all"), self.tracer))
        return out[0], out[1]


def _window_cap(window: int, softcap: float) -> dict:
    return {**({"window": int(window)} if window else {}), **({"softcap": float(softcap)} if softcap else {})}


# ---- emitting op calls (nn/op.py's functions are named wrappers of `call`) -------------------------------------

def _tracer(*xs) -> Tracer:
    for x in xs:
        x = as_tensor(x)
        if isinstance(x, Tensor):
            return x.tracer
    raise TypeError("an op needs at least one traced tensor argument")


def _operand(x, tracer: Tracer, dtype: str):
    x = as_tensor(x)
    if isinstance(x, Tensor):
        return x.var
    if isinstance(x, (int, float)):
        return const(np.asarray(x, dtype=dtype), tracer).var
    if isinstance(x, ShapeExpr):
        return x
    raise TypeError(f"cannot use {type(x).__name__} as an op argument")


def call(op: str, *args, **attrs) -> Tensor:
    """Emit `op(args, attrs)` into the function the traced arguments belong to."""
    tracer = _tracer(*args)
    dtype = next((as_tensor(a).dtype for a in args if isinstance(as_tensor(a), Tensor)), "float32")
    return tracer.emit(Call(op, tuple(_operand(a, tracer, dtype) for a in args), attrs), op.split(".")[-1])


def shape_expr(*values) -> ShapeExpr:
    return ShapeExpr(tuple(sym.as_expr(v) for v in values))


def const(value: np.ndarray, tracer: Tracer) -> Tensor:
    return Tensor(Constant(np.ascontiguousarray(value)), tracer)


def as_tensor(x: Any) -> Tensor:
    if isinstance(x, Parameter):
        if x.tensor is None:
            raise RuntimeError("a Parameter is used outside of Module.export")
        return x.tensor
    return x
