"""Loop-level tensor programs.

A `TensorProgram` is written in destination-passing style: its last `num_outputs` buffer params are
written, the others read. Index arithmetic is symbolic (`sym.Expr`), so loop variables, block
iterators and shape variables are all `sym.SymVar`s and share one canonical form. Scalar values are
one node type, `V(op, dtype, src, arg)`, in the manner of tinygrad's UOp.

A `Block` declares iterators with a domain (spatial or reduce) and a body that is one `Store`.
Unscheduled programs are sequences of blocks whose iterators are unbound (the block iterates its
whole domain); the schedule binds iterators to loop expressions. A reduction block has an `init`
store and a body `X[s] = combine(X[s], rhs)`, which is what makes vectorised interpretation and
pattern analysis possible.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from . import sym
from .sym import Expr as SExpr
from .sym import IntLike

# ---- buffers ---------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Buffer:
    name: str
    shape: tuple[SExpr, ...]
    dtype: str = "float32"
    scope: str = "global"  # global | local | shared

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(sym.as_expr(s) for s in self.shape))

    def __getitem__(self, idx) -> V:
        idx = idx if isinstance(idx, tuple) else (idx,)
        if len(idx) != len(self.shape):
            raise IndexError(f"buffer {self.name} has {len(self.shape)} dims, indexed with {len(idx)}")
        return V("load", self.dtype, (), (self, tuple(as_index(i) for i in idx)))

    def __repr__(self):
        return self.name


def as_index(i):
    """An index is a symbolic expression, or an int32 value for data-dependent indexing (gather)."""
    return i if isinstance(i, V) else sym.as_expr(i)


# ---- scalar values ---------------------------------------------------------------------------

# rint: to the nearest integer, ties to even
UNARY = ("neg", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "sin", "cos", "abs", "erf", "rint")
BINARY = ("add", "sub", "mul", "div", "max", "min", "pow")
BITWISE = ("shr", "shl", "bitand", "bitor")  # on integer values (packed quantized weights)
COMPARE = ("lt", "le", "gt", "ge", "eq", "ne")
LOGICAL = ("and", "or")


@dataclass(frozen=True)
class V:
    """A scalar value. op: const (arg=number) | index (arg=sym.Expr) | load (arg=(buffer, indices))
    | cast | select (src=(cond, a, b)) | a unary, binary, comparison or logical op."""

    op: str
    dtype: str
    src: tuple[V, ...] = ()
    arg: object = None

    def _bin(self, op, other, rev=False):
        other = lift(other, self.dtype)
        a, b = (other, self) if rev else (self, other)
        return V(op, a.dtype if a.op != "const" or b.op == "const" else b.dtype, (a, b))

    __add__ = lambda s, o: s._bin("add", o)
    __radd__ = lambda s, o: s._bin("add", o, True)
    __sub__ = lambda s, o: s._bin("sub", o)
    __rsub__ = lambda s, o: s._bin("sub", o, True)
    __mul__ = lambda s, o: s._bin("mul", o)
    __rmul__ = lambda s, o: s._bin("mul", o, True)
    __truediv__ = lambda s, o: s._bin("div", o)
    __rtruediv__ = lambda s, o: s._bin("div", o, True)
    __neg__ = lambda s: V("neg", s.dtype, (s,))

    def cmp(self, op: str, other) -> V:
        return V(op, "bool", (self, lift(other, self.dtype)))


def lift(x, dtype: str = "float32") -> V:
    if isinstance(x, V):
        return x
    if isinstance(x, (SExpr, sym.SymVar)):
        return V("index", "int32", (), sym.as_expr(x))
    if isinstance(x, bool):
        return V("const", "bool", (), x)
    if isinstance(x, int) and dtype.startswith(("int", "uint")):
        return V("const", dtype, (), x)
    return V("const", dtype if dtype.startswith(("float", "bfloat")) else "float32", (), float(x))


def const(x, dtype: str = "float32") -> V:
    return V("const", dtype, (), x)


def index(e: IntLike) -> V:
    return V("index", "int32", (), sym.as_expr(e))


def cast(dtype: str, x) -> V:
    x = lift(x)
    return x if x.dtype == dtype else V("cast", dtype, (x,))


def unary(op: str, x: V) -> V:
    assert op in UNARY, op
    return V(op, x.dtype, (x,))


def binary(op: str, a, b) -> V:
    assert op in BINARY, op
    a = lift(a)
    return V(op, a.dtype, (a, lift(b, a.dtype)))


def bitwise(op: str, a, b) -> V:
    """`shr`, `shl`, `bitand`, `bitor` of integer values (the right operand may be a Python int)."""
    assert op in BITWISE, op
    a = lift(a)
    return V(op, a.dtype, (a, lift(b, a.dtype)))


def dp4a(a, b, c) -> V:
    """The four signed bytes of int32 `a` times those of `b`, summed, plus `c` (CUDA's __dp4a, sm_61+; only the
    CUDA renderer writes it: schedule/dp4a.py)."""
    return V("dp4a", "int32", (lift(a, "int32"), lift(b, "int32"), lift(c, "int32")))


def vmax(a, b) -> V:
    return binary("max", a, b)


def select(cond: V, a, b) -> V:
    a = lift(a)
    return V("select", a.dtype, (cond, a, lift(b, a.dtype)))


def loads(v: V) -> list[V]:
    """All buffer loads in a value, in evaluation order."""
    out = [v] if v.op == "load" else []
    if v.op == "load":
        for i in v.arg[1]:
            if isinstance(i, V):
                out += loads(i)
    for s in v.src:
        out += loads(s)
    return out


# ---- statements ------------------------------------------------------------------------------

class Stmt:
    pass


@dataclass(frozen=True, eq=False)
class Store(Stmt):
    buffer: Buffer
    indices: tuple[SExpr, ...]
    value: V

    def __post_init__(self):
        object.__setattr__(self, "indices", tuple(as_index(i) for i in self.indices))


@dataclass(frozen=True, eq=False)
class Seq(Stmt):
    stmts: tuple[Stmt, ...]


@dataclass(frozen=True)
class IterVar:
    var: sym.SymVar
    extent: SExpr
    kind: str = "spatial"  # spatial | reduce
    binding: SExpr | None = None  # None: the block iterates the whole domain itself


@dataclass(frozen=True, eq=False)
class Block(Stmt):
    name: str
    iters: tuple[IterVar, ...]
    body: Store
    init: Store | None = None

    @property
    def spatial(self):
        return [it for it in self.iters if it.kind == "spatial"]

    @property
    def reduce(self):
        return [it for it in self.iters if it.kind == "reduce"]


@dataclass(frozen=True, eq=False)
class For(Stmt):
    var: sym.SymVar
    extent: SExpr
    body: Stmt
    kind: str = "serial"  # serial | parallel | unroll | vectorize | thread
    thread: str | None = None  # e.g. "blockIdx.x", "threadIdx.x" when kind == "thread"


@dataclass(frozen=True, eq=False)
class Alloc(Stmt):
    """An intermediate buffer alive for `body`."""

    buffer: Buffer
    body: Stmt


@dataclass(frozen=True, eq=False)
class IfThenElse(Stmt):
    cond: V
    then_body: Stmt
    else_body: Stmt | None = None


@dataclass(frozen=True, eq=False)
class Barrier(Stmt):
    scope: str = "shared"


@dataclass(frozen=True, eq=False)
class Intrin(Stmt):
    """A call of a target intrinsic that a schedule tensorized a block into (the renderer's per-ISA
    table has its code): `name(buffers..., ints...)`; `writes` are the buffers it stores to. Only
    kernels contain it, never a program the interpreter runs."""

    name: str
    buffers: tuple[Buffer, ...]
    ints: tuple[SExpr, ...] = ()
    writes: tuple[Buffer, ...] = ()


# ---- explicit vectors ------------------------------------------------------------------------------
# schedule/vectorize.py turns a "lanes" or "vector" loop into these on targets whose kernels have vector types
# (OpenCL): a value of dtype "float32x8" is 8 lanes; `vload` (arg=(buffer, start)) reads consecutive elements,
# `broadcast` repeats a scalar, `vec` lists the lanes' scalar values, and the usual ops apply lane-wise (a scalar
# right operand of an arithmetic op is broadcast by the op). Like Intrin, only kernels contain them.

def vector_dtype(dtype: str, lanes: int) -> str:
    return f"{dtype}x{lanes}"


def vector_lanes(dtype: str) -> tuple[str, int] | None:
    """("float32", 8) for "float32x8"; None for a scalar dtype."""
    base, x, n = dtype.rpartition("x")
    return (base, int(n)) if x and n.isdigit() else None


@dataclass(frozen=True, eq=False)
class VectorStore(Stmt):
    """buffer[start + c] = value's lane c, for every lane c (a float32 buffer)."""

    buffer: Buffer
    start: SExpr
    value: V


@dataclass(frozen=True, eq=False)
class LanesReduce(Stmt):
    """A sum reduction kept in vector registers: `for var in range(extent): vacc[k] += values[k]` with each vacc[k]
    starting at zero, then `accs[k][0] += (the sum of vacc[k]'s lanes)`, the lanes halved until four are left,
    then ((x + y) + (z + w))."""

    var: sym.SymVar
    extent: SExpr
    accs: tuple[Buffer, ...]
    values: tuple[V, ...]


@dataclass(frozen=True, eq=False)
class SubgroupReduce(Stmt):
    """A reduction across threads, collective over the work-group (every thread reaches it, as a barrier): for each
    store, every aligned group of `width` consecutive threads (a warp's lanes) combines ("add", "max" or "min") the
    store's value over its threads, and each thread of the group stores the result where the store says. `width` is
    a power of two of at most 32 that divides the kernel's threads. Renderers write it with the target's subgroup
    operations (CUDA's warp shuffles, WGSL's subgroups); where there are none, ir/subgroup.py lowers it to a
    shared-memory tree first. Like Intrin, only kernels contain it."""

    stores: tuple[Store, ...]
    combine: str
    width: int


@dataclass(frozen=True, eq=False)
class TensorProgram:
    name: str
    params: tuple[Buffer, ...]
    body: Stmt
    sym_params: tuple[sym.SymVar, ...] = ()
    num_outputs: int = 1
    attrs: dict = field(default_factory=dict)

    @property
    def inputs(self) -> tuple[Buffer, ...]:
        return self.params[: len(self.params) - self.num_outputs]

    @property
    def outputs(self) -> tuple[Buffer, ...]:
        return self.params[len(self.params) - self.num_outputs:]

    def shape_vars(self) -> list[sym.SymVar]:
        """Symbolic variables bound by the shapes of the params (a dim that is exactly a var)."""
        seen: list[sym.SymVar] = []
        for b in self.params:
            for s in b.shape:
                v = s.as_var
                if v is not None and v not in seen:
                    seen.append(v)
        return seen


# ---- construction helpers --------------------------------------------------------------------

def iters(names: str, extents: Sequence[IntLike], kinds: str | None = None) -> tuple[IterVar, ...]:
    """`iters("i j k", (n, m, k), "SSR")`: block iterators with fresh variables."""
    kinds = kinds or "S" * len(extents)
    return tuple(IterVar(sym.SymVar(n), sym.as_expr(e), "reduce" if k == "R" else "spatial")
                 for n, e, k in zip(names.split(), extents, kinds))


def v(it: IterVar) -> SExpr:
    return sym.as_expr(it.var)


def seq(*stmts: Stmt | Sequence[Stmt]) -> Stmt:
    flat: list[Stmt] = []
    for s in stmts:
        if isinstance(s, Seq):
            flat += s.stmts
        elif isinstance(s, (list, tuple)):
            flat += list(s)
        else:
            flat.append(s)
    return flat[0] if len(flat) == 1 else Seq(tuple(flat))


def walk(stmt: Stmt):
    """Pre-order traversal of statements."""
    yield stmt
    if isinstance(stmt, Seq):
        for s in stmt.stmts:
            yield from walk(s)
    elif isinstance(stmt, (For, Alloc)):
        yield from walk(stmt.body)
    elif isinstance(stmt, Block):
        if stmt.init is not None:
            yield stmt.init
        yield stmt.body
    elif isinstance(stmt, SubgroupReduce):
        yield from stmt.stores
    elif isinstance(stmt, IfThenElse):
        yield from walk(stmt.then_body)
        if stmt.else_body is not None:
            yield from walk(stmt.else_body)
