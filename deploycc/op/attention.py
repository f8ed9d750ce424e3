"""Rotary embedding, causal attention with grouped-query heads, and the KV-cache builtins.

The KV cache is a runtime object. `kv.begin(cache, shape([n]))` reserves n positions and returns the
new total length, which the model binds with match_cast to the symbolic `total_len`; `kv.append`
writes a layer's new keys and values into the reserved positions; `kv.keys` / `kv.values` return the
layer's cache as `[total_len, kv_heads, head_dim]`. Attention itself is a pure op on tensors, so it
legalizes like any other (query i sees keys j <= i + total_len - seq_len; with a sliding window of W,
also j > i + total_len - seq_len - W, the W most recent positions, itself included, as in transformers'
sliding-window mask). `softcap` c > 0 caps every score at c smoothly: c * tanh(s / c) (Gemma 2).
"""
from __future__ import annotations

import numpy as np

from ..ir import annotation as A
from ..ir import sym, tir
from ..ir.op import register
from ..ir.tir import Alloc, Block, Buffer, Seq, Store
from ..runtime.kvcache import KV_META
from ._common import OpError, ShapeMap, emit_tir, known_shape, same, shape_values

# ---- rotary embedding (rotate-half form, HF Llama/Qwen2) --------------------------------------

def _rope_infer(args, attrs):
    x = known_shape(args[0], "rope", "x")
    f = known_shape(args[1], "rope", "inv_freq")
    shape_values(args[2], "rope")
    if len(x) < 3:
        raise OpError("rope: x must be [..., seq, heads, head_dim]")
    if len(f) != 1 or not same(f[0] * 2, x[-1]):
        raise OpError(f"rope: inv_freq must be [head_dim / 2] = [{sym.to_python(x[-1] // 2)}]")
    return args[0].ann


def rope_reference(x, inv_freq, offset):
    n, d = x.shape[-3], x.shape[-1]
    pos = np.arange(offset[0], offset[0] + n, dtype=np.float32)
    ang = np.outer(pos, inv_freq).astype(np.float32)  # [n, d/2]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def _rope_legalize(call, module):
    smap = ShapeMap()
    X, F = smap.buffer("x", call.args[0].ann), smap.buffer("inv_freq", call.args[1].ann)
    Y = smap.buffer("y", call.ann)
    off = smap.dim(shape_values(call.args[2], "rope")[0])
    half = F.shape[0]
    nd = len(X.shape)
    blocks = []
    for part in ("lo", "hi"):
        its = tir.iters(" ".join(f"i{k}" for k in range(nd)), X.shape[:-1] + (half,))
        idx = tuple(tir.v(it) for it in its)
        lo, hi = idx[:-1] + (idx[-1],), idx[:-1] + (idx[-1] + half,)
        ang = tir.cast("float32", tir.index(idx[-3] + off)) * F[idx[-1]]
        c, s = tir.unary("cos", ang), tir.unary("sin", ang)
        if part == "lo":
            blocks.append(Block("rope_lo", its, Store(Y, lo, X[lo] * c - X[hi] * s)))
        else:
            blocks.append(Block("rope_hi", its, Store(Y, hi, X[hi] * c + X[lo] * s)))
    return emit_tir(module, "rope", smap, (X, F), (Y,), Seq(tuple(blocks)), call.args[:2], call.ann)


register("rope", _rope_infer, lambda x, f, off: rope_reference(x, f, off), _rope_legalize)


# rope_table(inv_freq, shape([offset, n]), scale=1) -> [n, r / 2, 2]: cos and sin of (offset + p) * inv_freq[i]
# (times `scale`, the attention factor of YaRN and LongRoPE), r the rotated dimensions (head_dim but for partial rotary),
# computed once per step and shared by every layer's rope_apply (q and k of all heads), so the
# transcendental functions run n * head_dim / 2 times a step instead of once per rotated element.

def _rope_table_infer(args, attrs):
    f = known_shape(args[0], "rope_table", "inv_freq")
    if isinstance(args[1].ann, A.TensorAnn):  # the positions of a batched step: one per token
        pos = known_shape(args[1], "rope_table", "positions")
        if len(f) != 1 or len(pos) != 1 or args[1].ann.dtype != "int32":
            raise OpError("rope_table: expects inv_freq [head_dim / 2] and int32 positions [n]")
        vals = (None, pos[0])
    else:
        vals = shape_values(args[1], "rope_table")
        if len(f) != 1 or len(vals) != 2:
            raise OpError("rope_table: expects inv_freq [head_dim / 2] and shape([offset, n]) or positions [n]")
    scale = attrs.get("scale", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
        raise OpError(f"rope_table: scale must be a positive number, got {scale!r}")
    return A.Tensor((vals[1], f[0], sym.as_expr(2)), "float32")


def rope_table_reference(inv_freq, vals, scale=1.0):
    """vals: (offset, n) for the positions offset .. offset + n - 1, or an int32 array of the positions."""
    if isinstance(vals, np.ndarray) and vals.dtype == np.int32:
        pos = vals.astype(np.float32)
    else:
        pos = np.arange(int(vals[0]), int(vals[0]) + int(vals[1]), dtype=np.float32)
    ang = np.outer(pos, inv_freq).astype(np.float32)
    table = np.stack([np.cos(ang), np.sin(ang)], axis=-1).astype(np.float32)
    return table if scale == 1.0 else (table * np.float32(scale)).astype(np.float32)


def _rope_table_legalize(call, module):
    smap = ShapeMap()
    F = smap.buffer("inv_freq", call.args[0].ann)
    T = smap.buffer("table", call.ann)
    its = tir.iters("p i", T.shape[:2])
    pp, i = (tir.v(it) for it in its)
    if isinstance(call.args[1].ann, A.TensorAnn):  # positions [n]
        P = smap.buffer("positions", call.args[1].ann)
        inputs, args, ang = (F, P), call.args[:2], tir.cast("float32", P[pp]) * F[i]
    else:
        off = smap.dim(shape_values(call.args[1], "rope_table")[0])
        inputs, args, ang = (F,), call.args[:1], tir.cast("float32", tir.index(pp + off)) * F[i]
    scale = float(call.attrs.get("scale", 1.0))
    cos, sin = tir.unary("cos", ang), tir.unary("sin", ang)
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    body = Seq((Block("rope_cos", its, Store(T, (pp, i, sym.as_expr(0)), cos)),
                Block("rope_sin", its, Store(T, (pp, i, sym.as_expr(1)), sin))))
    attrs = {"scale": scale} if scale != 1.0 else None
    return emit_tir(module, "rope_table", smap, inputs, (T,), body, args, call.ann, attrs)


register("rope_table", _rope_table_infer, rope_table_reference, _rope_table_legalize)


# rope_apply(x, table): the rotate-half rotary embedding of x [..., n, heads, head_dim] with the
# cos/sin table of rope_table (row p for the p-th of the n positions); a table of r / 2 < head_dim / 2
# frequencies rotates the first r dimensions and passes the rest (partial_rotary_factor, Phi-4).

def _rope_apply_infer(args, attrs):
    x = known_shape(args[0], "rope_apply", "x")
    t = known_shape(args[1], "rope_apply", "table")
    if len(x) < 3 or len(t) != 3:
        raise OpError("rope_apply: x must be [..., seq, heads, head_dim] and table [seq, head_dim / 2, 2]")
    if not same(t[0], x[-3]) or not (t[1].is_const and x[-1].is_const and 0 < 2 * t[1].value <= x[-1].value):
        raise OpError(f"rope_apply: table must be [{sym.to_python(x[-3])}, r / 2, 2], r <= {sym.to_python(x[-1])} "
                      f"the rotated dimensions")
    return args[0].ann


def rope_apply_reference(x, table):
    r = 2 * table.shape[1]  # the rotated dimensions (partial rotary: the rest pass through)
    cos, sin = table[:, None, :, 0], table[:, None, :, 1]
    x1, x2 = x[..., : r // 2], x[..., r // 2: r]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., r:]], axis=-1).astype(x.dtype)


def _rope_apply_legalize(call, module):
    smap = ShapeMap()
    X, T = smap.buffer("x", call.args[0].ann), smap.buffer("table", call.args[1].ann)
    Y = smap.buffer("y", call.ann)
    half = T.shape[1]
    nd = len(X.shape)
    blocks = []
    for part in ("lo", "hi"):
        its = tir.iters(" ".join(f"i{k}" for k in range(nd)), X.shape[:-1] + (half,))
        idx = tuple(tir.v(it) for it in its)
        lo, hi = idx[:-1] + (idx[-1],), idx[:-1] + (idx[-1] + half,)
        c, s = T[idx[-3], idx[-1], sym.as_expr(0)], T[idx[-3], idx[-1], sym.as_expr(1)]
        if part == "lo":
            blocks.append(Block("rope_lo", its, Store(Y, lo, X[lo] * c - X[hi] * s)))
        else:
            blocks.append(Block("rope_hi", its, Store(Y, hi, X[hi] * c + X[lo] * s)))
    rest = X.shape[-1] - 2 * half
    if not rest.is_const or rest.value:  # partial rotary: the dimensions past 2 * half pass through
        its = tir.iters(" ".join(f"i{k}" for k in range(nd)), X.shape[:-1] + (rest,))
        idx = tuple(tir.v(it) for it in its)
        at = idx[:-1] + (idx[-1] + 2 * half,)
        blocks.append(Block("rope_pass", its, Store(Y, at, X[at])))
    return emit_tir(module, "rope_apply", smap, (X, T), (Y,), Seq(tuple(blocks)), call.args[:2], call.ann)


register("rope_apply", _rope_apply_infer, lambda x, t: rope_apply_reference(x, t), _rope_apply_legalize)


# ---- causal attention ----------------------------------------------------------------------

def _attn_infer(args, attrs):
    q = known_shape(args[0], "attention", "q")
    k = known_shape(args[1], "attention", "k")
    v = known_shape(args[2], "attention", "v")
    if len(q) != 3 or len(k) != 3 or len(v) != 3:
        raise OpError("attention: q, k, v must be [seq, heads, head_dim]")
    if not (same(k[0], v[0]) and same(k[1], v[1]) and same(q[2], k[2]) and same(k[2], v[2])):
        raise OpError("attention: k and v must be [total_len, kv_heads, head_dim] matching q's head_dim")
    if len(args) == 4:  # a ring of k[0] rows: key j at row j % k[0], the logical total_len given apart
        if len(shape_values(args[3], "attention")) != 1 or not k[0].is_const or not attrs.get("window"):
            raise OpError("attention: a ring cache needs shape([total_len]), a constant row count and a window")
    if len(args) == 6:  # a page pool: query i of sequence seq[i] at position pos[i] (module docstring)
        pages, seq, pos = (known_shape(a, "attention", w) for a, w in zip(args[3:], ("pages", "seq", "pos")))
        size = attrs.get("page_size")
        if (len(pages) != 2 or len(seq) != 1 or len(pos) != 1 or not same(seq[0], q[0]) or not same(pos[0], q[0])
                or any(a.ann.dtype != "int32" for a in args[3:])):
            raise OpError("attention: a page pool needs int32 pages [batch, pages_len], seq [n] and pos [n]")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1 or not k[0].is_const or k[0].value % size:
            raise OpError(f"attention: page_size must be a positive integer dividing the pool's rows, got {size!r}")
    elif len(args) not in (3, 4):
        raise OpError(f"attention takes q, k, v [, shape([total_len]) | pages, seq, pos], got {len(args)} arguments")
    if q[1].is_const and k[1].is_const and q[1].value % k[1].value:
        raise OpError(f"attention: {q[1].value} query heads are not a multiple of {k[1].value} kv heads")
    window, cap = attrs.get("window", 0), attrs.get("softcap", 0.0)
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise OpError(f"attention: window must be a non-negative integer (0: none), got {window!r}")
    if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not cap >= 0:
        raise OpError(f"attention: softcap must be a non-negative number (0: none), got {cap!r}")
    return A.Tensor(q, args[0].ann.dtype)


def attention_reference(q, k, v, scale, window=0, softcap=0.0, total=None):
    """total: the logical key count where k and v are rings (key j at row j % len(k))."""
    n, h, d = q.shape
    if total is not None:
        rows = np.arange(int(total)) % k.shape[0]
        k, v = k[rows], v[rows]
    t, kvh, _ = k.shape
    g = h // kvh
    kk, vv = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)  # [t, h, d]
    s = np.einsum("nhd,thd->hnt", q, kk).astype(np.float32) * np.float32(scale)
    if softcap:
        s = (np.tanh(s / np.float32(softcap)) * np.float32(softcap)).astype(np.float32)
    last = np.arange(n)[:, None] + (t - n)  # the position of query i
    mask = np.arange(t)[None, :] <= last
    if window:
        mask &= np.arange(t)[None, :] > last - window
    s = np.where(mask[None], s, -np.inf)
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    p = p / p.sum(-1, keepdims=True)
    return np.einsum("hnt,thd->nhd", p, vv).astype(q.dtype)


def paged_attention_reference(q, k, v, pages, seq, pos, scale, page_size, window=0, softcap=0.0):
    """Each query i alone over the keys of its sequence seq[i] up to its position pos[i], key j at row
    pages[seq[i], j // page_size] * page_size + j % page_size of the pools k and v."""
    out = np.empty_like(q)
    for i in range(q.shape[0]):
        j = np.arange(int(pos[i]) + 1)
        rows = pages[seq[i], j // page_size] * page_size + j % page_size
        out[i:i + 1] = attention_reference(q[i:i + 1], k[rows], v[rows], scale, window, softcap)
    return out


def _attn_legalize(call, module):
    smap = ShapeMap()
    Q, K, Vb = (smap.buffer(n, a.ann) for n, a in zip(("q", "k", "v"), call.args))
    O = smap.buffer("o", call.ann)
    n, h, d = Q.shape
    t, kvh, _ = K.shape
    ring, paged = len(call.args) == 4, len(call.args) == 6
    inputs = (Q, K, Vb)
    if ring:  # keys in a ring of K.shape[0] rows; t the logical key count
        rows, t = K.shape[0], smap.dim(shape_values(call.args[3], "attention")[0])
    if paged:  # keys of each query's sequence through its page table; t the keys the table can name
        Pg, Sq, Ps = (smap.buffer(nm, a.ann) for nm, a in zip(("pages", "seq", "pos"), call.args[3:]))
        size = int(call.attrs["page_size"])
        inputs, t = (Q, K, Vb, Pg, Sq, Ps), Pg.shape[1] * size

    def row(j_, i_=None):
        if paged:
            return Pg[Sq[i_], sym.floordiv(j_, size)] * size + tir.index(sym.mod(j_, size))
        return sym.mod(j_, rows) if ring else j_
    group = h // kvh
    scale = float(call.attrs["scale"])
    window, cap = window_and_cap(call.attrs)
    S = Buffer("scores", (h, n, t), "float32", "local")
    M = Buffer("row_max", (h, n), "float32", "local")
    L = Buffer("row_sum", (h, n), "float32", "local")

    its = tir.iters("h i j k", (h, n, t, d), "SSSR")
    hh, i, j, k = (tir.v(x) for x in its)
    # a float16 cache's keys and values are read as float (tir.cast: nothing for a float32 cache)
    scores = Block("qk", its, Store(S, (hh, i, j), S[hh, i, j] + Q[i, hh, k] * tir.cast(
        "float32", K[row(j, i), hh // group, k])),
                   init=Store(S, (hh, i, j), tir.const(0.0)))

    def masked(i_, j_, value, hidden):
        """value where query i_ sees key j_, else hidden."""
        last = Ps[i_] if paged else tir.index(i_ + t - n)  # the query's own position
        out = tir.select(tir.index(j_).cmp("le", last), value, hidden)
        if window:
            out = tir.select(tir.index(j_).cmp("gt", last - window), out, hidden)
        return out

    def score(hh_, i_, j_):
        return capped(S[hh_, i_, j_] * scale, cap)

    its = tir.iters("h i j", (h, n, t), "SSR")
    hh, i, j = (tir.v(x) for x in its)
    mx = Block("max", its, Store(M, (hh, i), tir.vmax(M[hh, i], masked(i, j, score(hh, i, j), -np.inf))),
               init=Store(M, (hh, i), tir.const(-np.inf)))
    its = tir.iters("h i j", (h, n, t), "SSR")
    hh, i, j = (tir.v(x) for x in its)
    p = masked(i, j, tir.unary("exp", score(hh, i, j) - M[hh, i]), 0.0)
    sm = Block("sum_exp", its, Store(L, (hh, i), L[hh, i] + p), init=Store(L, (hh, i), tir.const(0.0)))
    its = tir.iters("i h c j", (n, h, d, t), "SSSR")
    i, hh, c, j = (tir.v(x) for x in its)
    p = masked(i, j, tir.unary("exp", score(hh, i, j) - M[hh, i]) / L[hh, i], 0.0)
    out = Block("pv", its, Store(O, (i, hh, c), O[i, hh, c] + p * tir.cast("float32", Vb[row(j, i), hh // group, c])),
                init=Store(O, (i, hh, c), tir.const(0.0)))
    body = Alloc(S, Alloc(M, Alloc(L, Seq((scores, mx, sm, out)))))
    attrs = {"scale": scale, **({"window": window} if window else {}), **({"softcap": cap} if cap else {}),
             **({"ring": int(rows.value)} if ring else {}), **({"page_size": size} if paged else {})}
    return emit_tir(module, "attention", smap, inputs, (O,), body, call.args[:len(inputs)], call.ann, attrs)


def window_and_cap(attrs) -> tuple[int, float]:
    """(sliding window, score cap) of an attention call or program; 0 for none."""
    return int(attrs.get("window", 0)), float(attrs.get("softcap", 0.0))


def capped(score: tir.V, cap: float) -> tir.V:
    """cap * tanh(score / cap), or the score where cap is 0."""
    return tir.unary("tanh", score * (1.0 / cap)) * cap if cap else score


def _attn_reference(q, k, v, *rest, **attrs):
    if len(rest) == 3:
        return paged_attention_reference(q, k, v, *rest, **attrs)
    return attention_reference(q, k, v, total=rest[0][0] if rest else None, **attrs)


register("attention", _attn_infer, _attn_reference, _attn_legalize)


# ---- KV-cache builtins (runtime objects; no tensor program) ----------------------------------

class ContextOverflow(ValueError):
    pass


class RefKVCache:
    """The reference KV cache: per layer, keys and values of shape [capacity, kv_heads, head_dim]."""

    def __init__(self, layers: int, capacity: int, kv_heads: int, head_dim: int, dtype=np.float32):
        self.capacity = capacity
        self.k = [np.zeros((capacity, kv_heads, head_dim), dtype) for _ in range(layers)]
        self.v = [np.zeros((capacity, kv_heads, head_dim), dtype) for _ in range(layers)]
        self.length = 0

    def begin(self, n: int) -> int:
        if self.length + n > self.capacity:
            raise ContextOverflow(f"{self.length} cached + {n} new tokens exceed the context window of "
                                  f"{self.capacity}; reset the session or raise --context-window")
        self.length += n
        return self.length

    def append(self, layer: int, k: np.ndarray, v: np.ndarray, rows: int = 0) -> None:
        """Positions length - n .. length - 1; in a ring of `rows` rows (kv.append's attr), position j at row j % rows."""
        n = k.shape[0]
        at = np.arange(self.length - n, self.length)
        if rows:
            if n > rows:
                raise ContextOverflow(f"a step of {n} tokens exceeds the ring of {rows} rows it writes")
            at = at % rows
        self.k[layer][at] = k
        self.v[layer][at] = v

    def view(self, which: str, layer: int, rows: int = 0) -> np.ndarray:
        buf = self.k[layer] if which == "k" else self.v[layer]
        return buf[:rows] if rows else buf[: self.length]

    def reset(self) -> None:
        self.length = 0


class RefPagedCache:
    """The reference page pool: per layer, keys and values of [pages * page_size, kv_heads, head_dim], and the
    metadata of the step about to run (`plan`): what the runtime's PagedKVCache hands the step function."""

    def __init__(self, layers: int, pages: int, page_size: int, kv_heads: int, head_dim: int, dtype=np.float32):
        self.page_size = page_size
        self.k = [np.zeros((pages * page_size, kv_heads, head_dim), dtype) for _ in range(layers)]
        self.v = [np.zeros((pages * page_size, kv_heads, head_dim), dtype) for _ in range(layers)]
        self.meta: dict[str, np.ndarray] = {}

    def plan(self, tables: list[list[int]], starts: list[int], counts: list[int]) -> None:
        """The step: sequence b (page table tables[b]) appends counts[b] tokens at positions starts[b] on."""
        from ..runtime.kvcache import paged_metadata

        self.meta = paged_metadata(tables, starts, counts, self.page_size)

    def append(self, layer: int, k: np.ndarray, v: np.ndarray) -> None:
        self.k[layer][self.meta["slot"]] = k
        self.v[layer][self.meta["slot"]] = v


def _cache_dtype(cache, dtype: str, op: str) -> None:
    held = cache.k[0].dtype
    if held != np.dtype(dtype):
        raise OpError(f"{op}: the reference cache holds {held}, and this module's KV cache is {dtype} "
                      f"(make it with dtype={dtype!r}: the module's attrs['kv_cache'])")


def _append_ref(cache, k, v, *slot, layer, rows=0, dtype="float32"):
    _cache_dtype(cache, dtype, "kv.append")  # storing into it rounds to nearest, ties to even, as the kernels do
    if slot:
        cache.append(layer, k, v)
    else:
        cache.append(layer, k, v, rows)
    return cache


def _view_ref(which):
    def view(cache, layer, rows=0, dtype="float32"):
        _cache_dtype(cache, dtype, f"kv.{which}")
        if isinstance(cache, RefPagedCache):
            return cache.k[layer] if which == "k" else cache.v[layer]
        return cache.view(which, layer, rows)
    return view


def _object(e, op):
    if not isinstance(e.ann, A.ObjectAnn):
        raise OpError(f"{op}: first argument must be the KV cache object")


def _begin_infer(args, attrs):
    _object(args[0], "kv.begin")
    shape_values(args[1], "kv.begin")
    return A.Shape(ndim=1)


def _append_infer(args, attrs):
    _object(args[0], "kv.append")
    k, v = known_shape(args[1], "kv.append", "k"), known_shape(args[2], "kv.append", "v")
    if len(k) != 3 or len(v) != 3 or not all(same(a, b) for a, b in zip(k, v)):
        raise OpError("kv.append: k and v must both be [seq, kv_heads, head_dim]")
    if len(args) == 4:  # into a page pool, token i at row slot[i]
        slot = known_shape(args[3], "kv.append", "slot")
        if len(slot) != 1 or not same(slot[0], k[0]) or args[3].ann.dtype != "int32":
            raise OpError("kv.append: slot must be int32 [seq]")
    return A.Object


def _pages_infer(args, attrs):
    _object(args[0], "kv.pages")
    return A.Shape(ndim=2)


def _meta_infer(args, attrs):
    _object(args[0], "kv.meta")
    name = attrs.get("name")
    if name not in KV_META:
        raise OpError(f"kv.meta: unknown metadata {name!r}")
    return A.Tensor(None, "int32", 2 if name == "pages" else 1)


def _view_infer(args, attrs):
    _object(args[0], "kv.view")
    return A.Tensor(None, attrs.get("dtype", "float32"), 3)


register("kv.begin", _begin_infer, lambda cache, n: (cache.begin(n[0]),), pure=False)
register("kv.append", _append_infer, _append_ref, pure=False)
register("kv.keys", _view_infer, _view_ref("k"), pure=False)
register("kv.values", _view_infer, _view_ref("v"), pure=False)
register("kv.pages", _pages_infer, lambda cache: cache.meta["pages"].shape, pure=False)
register("kv.meta", _meta_infer, lambda cache, name: cache.meta[name], pure=False)
