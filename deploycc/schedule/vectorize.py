"""vectorize: a kernel's "lanes" and "vector" loops as explicit vector values, for targets with vector types.

schedule/lowering.py writes a split reduction as a loop of kind "lanes" whose body is one `acc = acc + value_c`
per lane c (schedule/attention.py also writes "vector" loops: n stores per iteration to consecutive elements).
Where the target's kernels have vector types (OpenCL: PoCL does not vectorize across work-items when a kernel
has inner loops, so this is where its SIMD width gets used), this pass decides, lane by lane, what each value
is: a load whose flat index is consecutive across the lanes is a `vload`; a value equal in every lane stays a
scalar; an op whose operands are vectors is that op on vectors; anything else is a `vec` of the lanes' scalar
values (the kernel compiler folds the repeated loads, e.g. the packed word eight 4-bit lanes share). A loop it
cannot express (an odd lane count, an accumulator read inside its own values, a dtype without a vector type)
stays a scalar loop. The renderer then only spells the vectors (targets/opencl.py).
"""
from __future__ import annotations

from dataclasses import replace

from ..ir import sym
from ..ir.kernel import Schedule
from ..ir.tir import Alloc, For, IfThenElse, LanesReduce, Seq, Stmt, Store, V, VectorStore, loads, vector_dtype, vector_lanes

LANES = (4, 8, 16)
# the lane dtypes a vector can hold (OpenCL's float, uint and int vectors; half is read into float lanes)
VECTOR_DTYPES = ("float32", "float16", "uint32", "int32")
LANEWISE = ("add", "sub", "mul", "div", "shr", "shl", "bitand", "bitor")
FLOAT_UNARY = ("exp", "log", "sqrt", "rsqrt", "tanh", "sin", "cos", "abs", "erf")  # lane-wise built-ins


def vectorize(s: Schedule) -> Schedule:
    kernels = tuple(replace(k, body=_stmt(k.body)) for k in s.kernels)
    return replace(s, kernels=kernels)


def _stmt(st: Stmt) -> Stmt:
    if isinstance(st, For):
        if st.kind == "lanes":
            return _lanes_loop(st) or st
        if st.kind == "vector":
            return _vector_loop(st) or st
        body = _stmt(st.body)
        return st if body is st.body else For(st.var, st.extent, body, st.kind, st.thread)
    if isinstance(st, Seq):
        stmts = tuple(_stmt(x) for x in st.stmts)
        return st if all(a is b for a, b in zip(stmts, st.stmts)) else Seq(stmts)
    if isinstance(st, Alloc):
        body = _stmt(st.body)
        return st if body is st.body else Alloc(st.buffer, body)
    if isinstance(st, IfThenElse):
        then = _stmt(st.then_body)
        other = None if st.else_body is None else _stmt(st.else_body)
        if then is st.then_body and other is st.else_body:
            return st
        return IfThenElse(st.cond, then, other)
    return st


def _body(st: For) -> tuple:
    return st.body.stmts if isinstance(st.body, Seq) else (st.body,)


def _vector_loop(st: For) -> Stmt | None:
    """n stores per iteration to consecutive elements of one float32 buffer: one VectorStore of their values."""
    stores = _body(st)
    n = len(stores)
    if n not in LANES or not all(isinstance(x, Store) and x.buffer is stores[0].buffer for x in stores):
        return None
    buf = stores[0].buffer
    idx = [_flat(buf, x.indices) for x in stores]
    if buf.dtype != "float32" or not _consecutive(idx):
        return None
    try:
        value = _vector([x.value for x in stores])
    except _NotVectorizable:
        return None
    return For(st.var, st.extent, VectorStore(buf, idx[0], _as_vector(value, n)), "serial")


def _lanes_loop(st: For) -> Stmt | None:
    """One `acc = acc + value_c` per lane c (per accumulator of a register tile): a LanesReduce."""
    stores = _body(st)
    if not all(isinstance(x, Store) for x in stores):
        return None
    groups: dict = {}
    for x in stores:  # accumulator -> its lane values
        v = x.value
        if (x.buffer.dtype != "float32" or v.op != "add" or v.src[0].op != "load" or v.src[0].arg[0] is not x.buffer
                or not all(sym.as_expr(i).is_const and sym.as_expr(i).value == 0 for i in x.indices)):
            return None
        groups.setdefault(x.buffer, []).append(v.src[1])
    n = len(stores) // len(groups)
    if n not in LANES or any(len(vs) != n for vs in groups.values()):
        return None
    if any(ld.arg[0] in groups for vs in groups.values() for v in vs for ld in loads(v)):
        return None
    try:
        values = tuple(_as_vector(_vector(vs), n) for vs in groups.values())
    except _NotVectorizable:
        return None
    return LanesReduce(st.var, st.extent, tuple(groups), values)


def _as_vector(v: V, n: int, dtype: str | None = None) -> V:
    """v, or a scalar v repeated in n lanes of `dtype` (default: v's)."""
    return v if _is_vector(v) else V("broadcast", vector_dtype(dtype or v.dtype, n), (v,))


def _is_vector(v: V) -> bool:
    return vector_lanes(v.dtype) is not None


def _vector(lanes: list[V]) -> V:
    """The per-lane scalar values `lanes` as one value: a scalar when every lane is equal, else a vector."""
    n, v0 = len(lanes), lanes[0]
    if all(v == v0 for v in lanes[1:]):
        return v0
    ok = v0.dtype in VECTOR_DTYPES
    same = ok and all(v.op == v0.op and v.dtype == v0.dtype and len(v.src) == len(v0.src) for v in lanes)

    def literal() -> V:
        if not ok:
            raise _NotVectorizable
        return V("vec", vector_dtype(v0.dtype, n), tuple(lanes))

    if not same:
        return literal()
    vt = vector_dtype(v0.dtype, n)
    if v0.op == "load" and all(v.arg[0] is v0.arg[0] for v in lanes):
        buf = v0.arg[0]
        idx = [_flat(buf, v.arg[1]) for v in lanes]
        return V("vload", vt, (), (buf, idx[0])) if _consecutive(idx) else literal()
    if v0.op == "cast":
        inner = _vector([v.src[0] for v in lanes])
        return V("cast", v0.dtype, (inner,)) if not _is_vector(inner) else V("cast", vt, (inner,))
    if v0.op in LANEWISE:
        a, b = (_vector([v.src[k] for v in lanes]) for k in (0, 1))
        if v0.op in ("shr", "shl"):  # OpenCL shifts a vector only by a vector
            b = _as_vector(b, n, v0.dtype)
        return V(v0.op, vt, (_as_vector(a, n, v0.dtype), b))
    if v0.op == "neg":  # its operand differs across lanes, or the negations would be equal
        return V("neg", vt, (_vector([v.src[0] for v in lanes]),))
    if v0.op in FLOAT_UNARY and v0.dtype in ("float32", "float16"):
        return V(v0.op, vt, (_as_vector(_vector([v.src[0] for v in lanes]), n, v0.dtype),))
    return literal()


def _consecutive(idx: list) -> bool:
    return all(i is not None for i in idx) and all(
        sym.prove_eq(i - idx[0], sym.as_expr(c)) for c, i in enumerate(idx))


def _flat(buf, indices) -> sym.Expr | None:
    """The row-major flat index as one symbolic expression (None when an index is a value)."""
    total, stride = sym.as_expr(0), sym.as_expr(1)
    for d, i in zip(reversed(buf.shape), reversed(indices)):
        if isinstance(i, V):
            return None
        total = total + i * stride
        stride = stride * d
    return total


class _NotVectorizable(Exception):
    pass
