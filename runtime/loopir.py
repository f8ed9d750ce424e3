"""The loop-level reference interpreter of a package: tensor programs in their JSON form, run on numpy.

A package carries the loop-level program of every kernel it launches (kernels/programs.json, written by
deploycc/vm/programs.py), so that `python PKG verify --kernels` can hold the kernels to their specification
on the device the package runs on, without the compiler. This is deploycc/ir/tir_interp.py over that form
(tests/test_verify_kernels.py checks that both agree on every program of a package) and it is kept as
plain: blocks whose iterators are unbound run vectorised, each iterator a numpy index grid; a reduction
block reduces its right-hand side along the reduce axes; loops run one iteration at a time; every load
and store is bounds-checked, so an out-of-range index is an error here, never a silent wrong answer.

Three shortcuts, for speed only (SmolLM2's largest sizes: a 512-row lm_head is 14.5G grid points, attention over
a paged cache of 4096 keys 1.2G): a float sum of products (a matmul's `acc + a * b`) is reduced with einsum over
each factor's own axes instead of materialising the whole grid, so only float32 summation order differs; a load
whose indices vary along grid axes of their own is gathered row by row (`gather`), and a store of contiguous
ranges goes through a view (`place`), both giving the values numpy's broadcasting index would.

The JSON form (all names are unique within a program):
  sym       int | "name" | [op, sym...] with op in + * // % min max (runtime/symexpr.py's form)
  index     sym, or {"v": value} for a data-dependent index (a gather)
  value     ["const", dtype, number | "inf" | "-inf" | "nan"] | ["index", sym] | ["load", buffer, [index...]]
            | ["cast", dtype, value] | ["select", dtype, cond, a, b] | [op, dtype, value...]
  stmt      ["seq", [stmt...]] | ["block", name, [[var, extent, "S" | "R", binding sym | null]...], store,
            init store | null] | ["store", buffer, [index...], value] | ["for", var, extent, stmt]
            | ["alloc", buffer, stmt] | ["if", value, stmt, stmt | null] | ["barrier"]
  buffer    an index into the program's "buffers": {"name", "shape": [sym...], "dtype", "scope"}; the
            params are the first len(params) of them, the outputs the last num_outputs params
"""
from __future__ import annotations

import math
import string

import numpy as np

DTYPES = {"float32": np.float32, "float16": np.float16, "int32": np.int32, "int64": np.int64, "int16": np.int16,
          "uint16": np.uint16,
          "uint32": np.uint32, "uint8": np.uint8, "int8": np.int8, "bool": np.bool_}

_erf = np.vectorize(math.erf, otypes=[np.float64])
UNARY = {
    "neg": np.negative, "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "tanh": np.tanh,
    "rsqrt": lambda x: (1 / np.sqrt(x)).astype(x.dtype), "sigmoid": lambda x: (1 / (1 + np.exp(-x))).astype(x.dtype),
    "sin": np.sin, "cos": np.cos, "abs": np.abs, "erf": lambda x: _erf(x).astype(x.dtype),
    "rint": np.rint,
}
BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "max": np.maximum,
    "min": np.minimum, "pow": np.power, "shr": np.right_shift, "shl": np.left_shift, "bitand": np.bitwise_and,
    "bitor": np.bitwise_or, "lt": np.less, "le": np.less_equal, "gt": np.greater,
    "ge": np.greater_equal, "eq": np.equal, "ne": np.not_equal, "and": np.logical_and, "or": np.logical_or,
}
REDUCE = {"add": np.sum, "max": np.max, "min": np.min, "mul": np.prod}
ROUNDING = (set(UNARY) - {"neg", "abs", "rint"}) | {"add", "sub", "mul", "div", "pow"}  # float ops that round

MAX_GRID = 1 << 23  # elements evaluated at once; larger block domains run in slices


class ProgramError(RuntimeError):
    pass


# ---- symbolic integers ------------------------------------------------------------------------------

def sym_eval(j, env: dict):
    """A sym of ints and numpy index grids (min and max elementwise)."""
    if type(j) is int:
        return j
    if type(j) is str:
        return env[j]
    op, *args = j
    vals = [sym_eval(a, env) for a in args]
    if op == "+":
        return _fold(vals, lambda a, b: a + b)
    if op == "*":
        return _fold(vals, lambda a, b: a * b)
    if op == "//":
        return vals[0] // vals[1]
    if op == "%":
        return vals[0] % vals[1]
    if op in ("min", "max"):
        return _fold(vals, np.minimum if op == "min" else np.maximum)
    raise ProgramError(f"bad symbolic expression {j!r}")


def _fold(vals, f):
    out = vals[0]
    for v in vals[1:]:
        out = f(out, v)
    return out


def sym_names(j, out: set) -> set:
    if type(j) is str:
        out.add(j)
    elif type(j) is list:
        for a in j[1:]:
            sym_names(a, out)
    return out


def value_names(v: list, out: set) -> set:
    """The shape, loop and iterator variables a value mentions (the einsum path's factor axes)."""
    for node in value_nodes(v):
        if node[0] == "index":
            sym_names(node[1], out)
        elif node[0] == "load":
            for i in node[2]:
                if type(i) is not dict:
                    sym_names(i, out)
    return out


def value_nodes(v: list):
    """A value and every value inside it (operands, data-dependent indices), pre-order."""
    yield v
    if v[0] == "load":
        for i in v[2]:
            if type(i) is dict:
                yield from value_nodes(i["v"])
    elif v[0] not in ("const", "index"):
        for s in v[2:]:
            yield from value_nodes(s)


def shape_of(prog: dict, buf: int, env: dict) -> tuple[int, ...]:
    return tuple(int(sym_eval(d, env)) for d in prog["buffers"][buf]["shape"])


# ---- activations rounded as the cpu target's integer kernels round them -----------------------------

ACTIVATION_BLOCK = 32


def round_activations(x: np.ndarray, bits: int) -> np.ndarray:
    """deploycc/op/linalg.py round_activations_np (tests check they agree): per block of 32, d = max|x| / (2^(bits-1)
    - 1) and codes rint(x * (1 / d)), round half to even; an all-zero block stays 0."""
    x = np.asarray(x, np.float32)
    b = x.reshape(-1, ACTIVATION_BLOCK)
    d = np.abs(b).max(axis=1, keepdims=True) / np.float32((1 << (bits - 1)) - 1)
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
    return (np.rint(b * inv) * d).astype(np.float32).reshape(x.shape)


# ---- running a program ------------------------------------------------------------------------------

def run_program(prog: dict, arrays: list[np.ndarray], env: dict) -> None:
    """Run `prog` in place on `arrays` (one per param, outputs last); `env` gives every shape variable."""
    params = prog["params"]
    if len(arrays) != len(params):
        raise ProgramError(f"{prog['name']}: {len(params)} buffers expected, got {len(arrays)}")
    bufs = {}
    for b, a in zip(params, arrays):
        want, info = shape_of(prog, b, env), prog["buffers"][b]
        if a.shape != want or a.dtype != DTYPES[info["dtype"]]:
            raise ProgramError(f"{prog['name']}: {info['name']} expects {want} {info['dtype']}, got {a.shape} {a.dtype}")
        bufs[b] = a
    _Exec(prog, bufs).stmt(prog["body"], dict(env))


class _Exec:
    def __init__(self, prog: dict, bufs: dict[int, np.ndarray]):
        self.prog, self.bufs = prog, bufs

    def name(self, b: int) -> str:
        return self.prog["buffers"][b]["name"]

    # ---- values -----------------------------------------------------------------------------
    def value(self, v: list, env: dict) -> np.ndarray:
        op = v[0]
        if op == "const":
            return np.asarray(float(v[2]) if type(v[2]) is str else v[2], dtype=DTYPES[v[1]])
        if op == "index":
            return np.asarray(sym_eval(v[1], env), dtype=np.int64)
        if op == "load":
            return self.load(v[1], v[2], env)
        if op == "cast":
            return self.value(v[2], env).astype(DTYPES[v[1]])
        if op == "select":
            c, a, b = (self.value(s, env) for s in v[2:])
            return np.where(c, a, b).astype(DTYPES[v[1]])
        if op in UNARY:
            return UNARY[op](self.value(v[2], env))
        if op in BINARY:
            a, b = (self.value(s, env) for s in v[2:])
            out = BINARY[op](a, b)
            return out if v[1] == "bool" else out.astype(DTYPES[v[1]], copy=False)
        raise ProgramError(f"unknown value op {op!r}")

    def indices(self, buf: int, idx: list, env: dict) -> tuple:
        if buf not in self.bufs:
            raise ProgramError(f"access to unallocated buffer {self.name(buf)}")
        out = []
        for axis, (i, n) in enumerate(zip(idx, self.bufs[buf].shape)):
            iv = self.value(i["v"], env) if type(i) is dict else np.asarray(sym_eval(i, env))
            iv = iv.astype(np.int64, copy=False)
            if iv.size and (iv.min() < 0 or iv.max() >= n):
                raise ProgramError(f"index of {self.name(buf)} axis {axis} out of range [{int(iv.min())}, "
                                   f"{int(iv.max())}] for size {n}")
            out.append(iv)
        return tuple(out)

    def load(self, buf: int, idx: list, env: dict) -> np.ndarray:
        return gather(self.bufs[buf], self.indices(buf, idx, env))

    # ---- statements -------------------------------------------------------------------------
    def stmt(self, st: list, env: dict) -> None:
        kind = st[0]
        if kind == "seq":
            for s in st[1]:
                self.stmt(s, env)
        elif kind == "block":
            self.block(st, env)
        elif kind == "store":
            self.store(st, env, None)
        elif kind == "for":
            for i in range(int(sym_eval(st[2], env))):
                env[st[1]] = i
                self.stmt(st[3], env)
            env.pop(st[1], None)
        elif kind == "alloc":
            b = st[1]
            self.bufs[b] = np.zeros(shape_of(self.prog, b, env), DTYPES[self.prog["buffers"][b]["dtype"]])
            self.stmt(st[2], env)
            del self.bufs[b]
        elif kind == "if":
            if bool(self.value(st[1], env)):
                self.stmt(st[2], env)
            elif st[3] is not None:
                self.stmt(st[3], env)
        elif kind != "barrier":
            raise ProgramError(f"cannot run a {kind!r} statement")

    def store(self, st: list, env: dict, shape) -> None:
        _, buf, idx, value = st
        ix = self.indices(buf, idx, env)
        val = self.value(value, env)
        if shape is None:
            self.bufs[buf][ix] = val
        else:
            place(self.bufs[buf], ix, val, shape)

    def block(self, blk: list, outer: dict) -> None:
        iters, body = blk[2], blk[3]
        env = dict(outer)
        for var, _, _, binding in iters:
            if binding is not None:
                env[var] = sym_eval(binding, env)
        free = [it for it in iters if it[3] is None]
        extents = [int(sym_eval(it[1], env)) for it in free]
        if any(e == 0 for e in extents):
            return
        chunk_axis, step = self._slicing(free, extents, body)
        start = 0
        while True:
            ranges = [(start, min(start + step, e)) if k == chunk_axis else (0, e) for k, e in enumerate(extents)]
            self._block_slice(blk, free, ranges, env)
            start += step
            if chunk_axis is None or start >= extents[chunk_axis]:
                break

    def _slicing(self, free, extents, body) -> tuple[int | None, int]:
        """The spatial axis to slice and the slice length, so that what is evaluated at once stays under
        MAX_GRID: the whole grid, or on the einsum path the largest factor (the axes it mentions)."""
        spatial = [k for k, it in enumerate(free) if it[2] == "S"]
        pieces = [set(range(len(free)))]
        parts = self._einsum_parts(free, body)
        if parts is not None:
            names = [it[0] for it in free]
            pieces = [{k for k, n in enumerate(names) if n in value_names(f, set())} for f in parts[1:]]
        size = {frozenset(p): math.prod(extents[k] for k in p) for p in pieces}
        big = max(pieces, key=lambda p: size[frozenset(p)])
        total = size[frozenset(big)]
        axes = [k for k in spatial if k in big]
        if total <= MAX_GRID or not axes:
            return None, 0
        axis = max(axes, key=lambda k: extents[k])
        return axis, max(1, MAX_GRID * extents[axis] // total)

    def _einsum_parts(self, free, body):
        """(None, a, b) when the block is a float sum of products `X[s] = X[s] + a * b`, else None."""
        if not any(it[2] == "R" for it in free):
            return None
        combine, rhs = reduction_parts(body)
        if combine != "add" or rhs[0] != "mul" or not rhs[1].startswith("float"):
            return None
        return None, rhs[2], rhs[3]

    def _block_slice(self, blk: list, free, ranges, env) -> None:
        body, init = blk[3], blk[4]
        k = len(free)
        grid_shape = tuple(hi - lo for lo, hi in ranges)
        genv = dict(env)
        for axis, (it, (lo, hi)) in enumerate(zip(free, ranges)):
            shape = [1] * k
            shape[axis] = hi - lo
            genv[it[0]] = np.arange(lo, hi).reshape(shape)
        red_axes = tuple(a for a, it in enumerate(free) if it[2] == "R")
        if not red_axes:
            self.store(body, genv, grid_shape)
            return
        spatial_shape = tuple(1 if a in red_axes else n for a, n in enumerate(grid_shape))
        red_vars = {free[a][0] for a in red_axes}
        senv = {v: (np.zeros((1,) * k, dtype=np.int64) if v in red_vars else x) for v, x in genv.items()}
        first = all(lo == 0 for a, (lo, hi) in enumerate(ranges) if a in red_axes)
        if init is not None and first:
            self.store(init, senv, spatial_shape)
        combine, rhs = reduction_parts(body)
        parts = self._einsum_parts(free, body)
        if parts is not None:
            a, b = (self.value(f, genv) for f in parts[1:])
            part = _sum_of_products(a, b, grid_shape, red_axes)
        else:
            r = np.broadcast_to(self.value(rhs, genv), grid_shape)
            part = REDUCE[combine](r, axis=red_axes, keepdims=True)
        place(self.bufs[body[1]], self.indices(body[1], body[2], senv), part, spatial_shape, BINARY[combine])


def gather(arr: np.ndarray, ix: tuple) -> np.ndarray:
    """arr[ix] (numpy's broadcasting index). Where each index varies along grid axes of its own (a paged KV cache's
    k[row(i, j), h // 3, c]), as one take per buffer axis: whole rows copied instead of single elements."""
    k = max((i.ndim for i in ix), default=0)
    ix = [i.reshape((1,) * (k - i.ndim) + i.shape) for i in ix]
    groups = [[g for g in range(k) if i.shape[g] > 1] for i in ix]
    flat = [g for grp in groups for g in grp]
    out_shape = tuple(max((i.shape[g] for i in ix), default=1) for g in range(k))
    if len(ix) < 2 or len(flat) != len(set(flat)) or math.prod(out_shape) < 1 << 14:
        return arr[tuple(ix)]
    y = arr
    for a, i in enumerate(ix):
        v = i.reshape(-1)
        if v.size != arr.shape[a] or not np.array_equal(v, np.arange(v.size)):  # not the whole axis in order
            y = np.take(y, v, axis=a)
    y = y.reshape([out_shape[g] for g in flat])  # per buffer axis, its grid axes in order
    return y.transpose(np.argsort(flat)).reshape(out_shape)


def place(arr: np.ndarray, ix: tuple, val: np.ndarray, shape: tuple, combine=None) -> None:
    """arr[ix] = val, or combine(arr[ix], val), with ix and val broadcast to `shape`: through a view where every
    index is a contiguous range along a grid axis of its own (out[i, j] = ...), else numpy's broadcasting index."""
    sl = _slices(ix, shape)
    if sl is None:
        ix = tuple(np.broadcast_to(i, shape) for i in ix)
        val = np.broadcast_to(val, shape)
        arr[ix] = (val if combine is None else combine(arr[ix], val)).astype(arr.dtype, copy=False)
        return
    index, axes = sl
    view = arr[index]
    rest = [g for g in range(len(shape)) if g not in axes]  # all of size 1
    val = np.broadcast_to(val, shape).transpose(axes + rest).reshape(view.shape)
    arr[index] = (val if combine is None else combine(view, val)).astype(arr.dtype, copy=False)


def _slices(ix: tuple, shape: tuple):
    """(basic index, grid axis of each sliced buffer axis) when `place` may go through a view, else None."""
    k = len(shape)
    index, axes = [], []
    for i in ix:
        i = i.reshape((1,) * (k - i.ndim) + i.shape)
        grid = [g for g in range(k) if i.shape[g] > 1]
        v = i.reshape(-1)
        if not grid:
            index.append(int(v[0]))
            continue
        lo = int(v[0])
        if len(grid) > 1 or grid[0] in axes or not np.array_equal(v, np.arange(lo, lo + v.size)):
            return None
        index.append(slice(lo, lo + v.size))
        axes.append(grid[0])
    if any(shape[g] > 1 and g not in axes for g in range(k)):
        return None
    return tuple(index), axes


def _sum_of_products(a: np.ndarray, b: np.ndarray, grid: tuple, red_axes: tuple) -> np.ndarray:
    """sum over red_axes of a * b (both broadcastable to `grid`), keepdims, without the grid in memory."""
    k = len(grid)
    letters = string.ascii_letters[:k]
    ops, subs = [], []
    for f in (a, b):
        f = f.reshape((1,) * (k - f.ndim) + f.shape)
        keep = [ax for ax in range(k) if f.shape[ax] > 1]
        ops.append(f.reshape([f.shape[ax] for ax in keep]))
        subs.append("".join(letters[ax] for ax in keep))
    out_axes = [ax for ax in range(k) if ax not in red_axes and grid[ax] > 1]
    mentioned = set(subs[0]) | set(subs[1])
    out = "".join(letters[ax] for ax in out_axes if letters[ax] in mentioned)
    # BLAS, unless a factor is as large as the product itself (a paged cache's gathered keys): BLAS would first copy
    # it into its layout, where numpy's own loop reads it in place
    macs = math.prod(grid[ax] for ax in range(k) if letters[ax] in mentioned)
    res = np.einsum(f"{subs[0]},{subs[1]}->{out}", *ops, optimize=bool(16 * (a.size + b.size) <= macs))
    # a reduce axis neither factor mentions adds the same product once per point of it
    res = res * math.prod(grid[ax] for ax in red_axes if letters[ax] not in mentioned)
    shape = [grid[ax] if ax in out_axes and letters[ax] in mentioned else 1 for ax in range(k)]
    return np.asarray(res, dtype=np.result_type(a, b)).reshape(shape)


def reduction_parts(store: list) -> tuple[str, list]:
    """Split a reduction body `X[s] = combine(X[s], rhs)` into (combine, rhs)."""
    _, buf, idx, v = store
    if v[0] in REDUCE and len(v) == 4:
        for mine, other in ((v[2], v[3]), (v[3], v[2])):
            if mine[0] == "load" and mine[1] == buf and mine[2] == idx:
                return v[0], other
    raise ProgramError(f"a reduction block must store combine(buffer[...], value), not {v[0]}")


def stmt_values(st: list):
    """The values a statement computes (stored values, conditions, data-dependent indices), outermost first."""
    kind = st[0]
    if kind == "seq":
        for s in st[1]:
            yield from stmt_values(s)
    elif kind == "block":
        yield from stmt_values(st[3])
        if st[4] is not None:
            yield from stmt_values(st[4])
    elif kind == "store":
        yield from (i["v"] for i in st[2] if type(i) is dict)
        yield st[3]
    elif kind in ("for", "alloc"):
        yield from stmt_values(st[-1])
    elif kind == "if":
        yield st[1]
        for s in st[2:]:
            if s is not None:
                yield from stmt_values(s)


def exact(prog: dict) -> bool:
    """Whether the program rounds no float (data movement, casts, integer arithmetic, max and min): its kernels
    must then agree with it bit for bit."""
    return not any(n[0] in ROUNDING and n[1].startswith("float")
                   for v in stmt_values(prog["body"]) for n in value_nodes(v))
