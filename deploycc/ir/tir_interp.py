"""Reference interpreter for tensor programs, on numpy.

Blocks whose iterators are unbound run vectorised: each iterator becomes a numpy index grid and the
store runs once for the whole domain (a reduction block reduces its right-hand side along the reduce
axes). Loops run one iteration at a time. Loads are bounds-checked, so an out-of-range index in a
generated program is an error here rather than a silent wrong answer.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from . import sym
from .tir import Alloc, Barrier, Block, Buffer, For, IfThenElse, Seq, Store, TensorProgram, V

NP_DTYPES = {"float32": np.float32, "float16": np.float16, "int32": np.int32, "int64": np.int64,
             "uint32": np.uint32, "uint8": np.uint8, "int8": np.int8, "int16": np.int16,
             "bool": np.bool_}

_SYM_NP_OPS = {"floordiv": lambda a, b: a // b, "mod": lambda a, b: a % b, "min": np.minimum, "max": np.maximum}

# the elementwise and reduction tables are the package's loop-level interpreter's (runtime/loopir.py, which
# verify --kernels runs without the compiler): one definition of what each op computes
from ..runtime.loopir import BINARY as BINARY_NP  # noqa: E402
from ..runtime.loopir import REDUCE as REDUCE_NP  # noqa: E402
from ..runtime.loopir import UNARY as UNARY_NP  # noqa: E402

MAX_GRID = 1 << 23  # elements evaluated at once; larger block domains run in slices


class ProgramError(RuntimeError):
    pass


def bind_shapes(prog: TensorProgram, arrays: Sequence[np.ndarray], sym_args: Sequence[int]) -> dict:
    """Bind the program's symbolic variables from argument shapes and check every dimension."""
    env: dict[sym.SymVar, int] = dict(zip(prog.sym_params, (int(s) for s in sym_args)))
    for buf, arr in zip(prog.params, arrays):
        if arr.ndim != len(buf.shape):
            raise ProgramError(f"{prog.name}: {buf.name} expects {len(buf.shape)} dims, got shape {arr.shape}")
        for d, n in zip(buf.shape, arr.shape):
            v = d.as_var
            if v is not None and v not in env:
                env[v] = n
    for buf, arr in zip(prog.params, arrays):
        want = tuple(sym.evaluate(d, env) for d in buf.shape)
        if want != arr.shape:
            raise ProgramError(f"{prog.name}: {buf.name} expects shape {want}, got {arr.shape}")
        if arr.dtype != NP_DTYPES[buf.dtype]:
            raise ProgramError(f"{prog.name}: {buf.name} expects {buf.dtype}, got {arr.dtype}")
    return env


def run_program(prog: TensorProgram, arrays: Sequence[np.ndarray], sym_args: Sequence[int] = ()) -> None:
    """Run `prog` in place: outputs (the last params) are written into the given arrays."""
    env = bind_shapes(prog, arrays, sym_args)
    bufs = {b: a for b, a in zip(prog.params, arrays)}
    _Exec(bufs).stmt(prog.body, env)


class _Exec:
    def __init__(self, bufs: dict[Buffer, np.ndarray]):
        self.bufs = bufs

    # ---- values -----------------------------------------------------------------------------
    def value(self, v: V, env: Mapping) -> np.ndarray:
        op = v.op
        if op == "const":
            return np.asarray(v.arg, dtype=NP_DTYPES[v.dtype])
        if op == "index":
            return np.asarray(sym.evaluate(v.arg, env, _SYM_NP_OPS), dtype=np.int64)
        if op == "load":
            buf, idx = v.arg
            return self.load(buf, idx, env)
        if op == "cast":
            return self.value(v.src[0], env).astype(NP_DTYPES[v.dtype])
        if op == "select":
            c, a, b = (self.value(s, env) for s in v.src)
            return np.where(c, a, b).astype(NP_DTYPES[v.dtype])
        if op in UNARY_NP:
            return UNARY_NP[op](self.value(v.src[0], env))
        if op in BINARY_NP:
            a, b = (self.value(s, env) for s in v.src)
            out = BINARY_NP[op](a, b)
            return out if v.dtype == "bool" else out.astype(NP_DTYPES[v.dtype], copy=False)
        raise ProgramError(f"unknown value op {op!r}")

    def indices(self, buf: Buffer, idx, env) -> tuple:
        out = []
        arr = self.bufs[buf]
        for axis, (i, n) in enumerate(zip(idx, arr.shape)):
            if isinstance(i, V):
                iv = self.value(i, env).astype(np.int64)
            else:
                iv = np.asarray(sym.evaluate(i, env, _SYM_NP_OPS), dtype=np.int64)
            if iv.size and (iv.min() < 0 or iv.max() >= n):
                raise ProgramError(f"index {i if isinstance(i, V) else sym.to_python(i)} of {buf.name} axis {axis} out of range "
                                   f"[{int(iv.min())}, {int(iv.max())}] for size {n}")
            out.append(iv)
        return tuple(out)

    def load(self, buf: Buffer, idx, env) -> np.ndarray:
        if buf not in self.bufs:
            raise ProgramError(f"load from unallocated buffer {buf.name}")
        return self.bufs[buf][self.indices(buf, idx, env)]

    # ---- statements -------------------------------------------------------------------------
    def stmt(self, st, env: dict) -> None:
        if isinstance(st, Seq):
            for s in st.stmts:
                self.stmt(s, env)
        elif isinstance(st, Block):
            self.block(st, env)
        elif isinstance(st, Store):
            self.store(st, env, None)
        elif isinstance(st, For):
            n = int(sym.evaluate(st.extent, env))
            for i in range(n):
                env[st.var] = i
                self.stmt(st.body, env)
            env.pop(st.var, None)
        elif isinstance(st, Alloc):
            shape = tuple(int(sym.evaluate(d, env)) for d in st.buffer.shape)
            self.bufs[st.buffer] = np.zeros(shape, NP_DTYPES[st.buffer.dtype])
            self.stmt(st.body, env)
            del self.bufs[st.buffer]
        elif isinstance(st, IfThenElse):
            if bool(self.value(st.cond, env)):
                self.stmt(st.then_body, env)
            elif st.else_body is not None:
                self.stmt(st.else_body, env)
        elif isinstance(st, Barrier):
            pass
        else:
            raise ProgramError(f"cannot run {type(st).__name__}")

    def store(self, st: Store, env, shape) -> None:
        idx = self.indices(st.buffer, st.indices, env)
        val = self.value(st.value, env)
        arr = self.bufs[st.buffer]
        if shape is not None:
            idx = tuple(np.broadcast_to(i, shape) for i in idx)
            val = np.broadcast_to(val, shape)
        arr[idx] = val.astype(arr.dtype, copy=False)

    def block(self, blk: Block, outer: dict) -> None:
        env = dict(outer)
        free = [it for it in blk.iters if it.binding is None]
        for it in blk.iters:
            if it.binding is not None:
                env[it.var] = sym.evaluate(it.binding, env, _SYM_NP_OPS)
        extents = [int(sym.evaluate(it.extent, env)) for it in free]
        if any(e == 0 for e in extents):
            return
        # Slice the largest spatial axis so that the evaluated grid stays small.
        total = math.prod(extents) if extents else 1
        spatial_axes = [k for k, it in enumerate(free) if it.kind == "spatial"]
        chunk_axis = max(spatial_axes, key=lambda k: extents[k]) if spatial_axes and total > MAX_GRID else None
        step = 0 if chunk_axis is None else max(1, MAX_GRID * extents[chunk_axis] // total)
        start = 0
        while True:
            ranges = []
            for k, e in enumerate(extents):
                lo, hi = (start, min(start + step, e)) if k == chunk_axis else (0, e)
                ranges.append((lo, hi))
            self._block_slice(blk, free, ranges, env)
            if chunk_axis is None:
                break
            start += step
            if start >= extents[chunk_axis]:
                break

    def _block_slice(self, blk: Block, free, ranges, env) -> None:
        k = len(free)
        grid_shape = tuple(hi - lo for lo, hi in ranges)
        genv = dict(env)
        for axis, (it, (lo, hi)) in enumerate(zip(free, ranges)):
            shape = [1] * k
            shape[axis] = hi - lo
            genv[it.var] = np.arange(lo, hi).reshape(shape)
        red_axes = tuple(a for a, it in enumerate(free) if it.kind == "reduce")
        if not red_axes:
            self.store(blk.body, genv, grid_shape)
            return
        spatial_shape = tuple(1 if a in red_axes else n for a, n in enumerate(grid_shape))
        red_vars = {free[a].var for a in red_axes}
        senv = {v: (np.zeros((1,) * k, dtype=np.int64) if v in red_vars else x) for v, x in genv.items()}
        first = all(lo == 0 for a, (lo, hi) in enumerate(ranges) if a in red_axes)
        if blk.init is not None and first:
            self.store(blk.init, senv, spatial_shape)
        combine, rhs = reduction_parts(blk)
        r = np.broadcast_to(self.value(rhs, genv), grid_shape)
        part = REDUCE_NP[combine](r, axis=red_axes, keepdims=True)
        idx = tuple(np.broadcast_to(i, spatial_shape) for i in self.indices(blk.body.buffer, blk.body.indices, senv))
        arr = self.bufs[blk.body.buffer]
        arr[idx] = BINARY_NP[combine](arr[idx], part).astype(arr.dtype, copy=False)


def reduction_parts(blk: Block) -> tuple[str, V]:
    """Split a reduction body `X[s] = combine(X[s], rhs)` into (combine, rhs)."""
    st = blk.body
    v = st.value
    if v.op in REDUCE_NP and len(v.src) == 2:
        for mine, other in ((v.src[0], v.src[1]), (v.src[1], v.src[0])):
            if mine.op == "load" and mine.arg[0] is st.buffer and mine.arg[1] == st.indices:
                return v.op, other
    raise ProgramError(f"reduction block {blk.name} must store combine({st.buffer.name}[...], value)")
