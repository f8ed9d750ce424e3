"""Shared lowering steps for schedule rules: thread loops, blocks to serial loops, local buffers."""
from __future__ import annotations

from ..ir import sym, tir
from ..ir.kernel import allocs_of, strip_allocs
from ..ir.tir import Alloc, Block, Buffer, For, IfThenElse, Seq, Stmt, Store, V
from ..ir.tir_interp import reduction_parts
from ..ir.tir_rewrite import Substitute, map_value


def thread_grid(total: sym.Expr, threads: int, body_of) -> tuple[Stmt, sym.Expr]:
    """`for g (groups): for t (threads): r = g*threads + t; if r < total: body_of(r)`."""
    g, t = sym.SymVar("g"), sym.SymVar("t")
    r = sym.as_expr(g) * threads + sym.as_expr(t)
    groups = sym.floordiv(sym.as_expr(total) + (threads - 1), threads)
    guard = IfThenElse(tir.index(r).cmp("lt", tir.index(total)), body_of(r))
    return For(g, groups, For(t, sym.as_expr(threads), guard, "thread", "local"), "thread", "group"), groups


def batched_copy(name: str, trips: int, trip, batch: int) -> Stmt:
    """`for x < trips: the stores trip(x) gives`, where trip(x) -> ([(buffer, index, loaded value), ...], guard or
    None), written so that the loads of `batch` trips are in flight together: loaded into registers first (the trip
    clamped to the last, so that every load is one a trip makes), then stored (a trip past `trips`, or whose guard
    fails, stores nothing). A copy loop whose trips each store what they load, guarded or not, left nvcc a branch
    and a round trip to memory a trip (schedule/attention.py); both inner loops are written out (`unroll`)."""
    b, y = sym.SymVar(f"{name}_b"), sym.SymVar(f"{name}_y")
    x = sym.as_expr(b) * batch + sym.as_expr(y)
    per = len(trip(sym.as_expr(0))[0])
    regs = Buffer(name, (batch * per,), "float32", "local")
    at = lambda v: sym.as_expr(y) * per + v  # noqa: E731
    stores, guard = trip(x)
    loads = [Store(regs, (at(v),), value) for v, (_, _, value) in enumerate(trip(sym.smin(x, trips - 1))[0])]
    puts: Stmt = Seq(tuple(Store(buf, (idx,), regs[at(v)]) for v, (buf, idx, _) in enumerate(stores)))
    inside = None if trips % batch == 0 else tir.index(x).cmp("lt", tir.index(trips))
    test = guard if inside is None else inside if guard is None else tir.V("and", "bool", (inside, guard))
    if test is not None:
        puts = IfThenElse(test, puts)
    y2 = sym.SymVar(f"{name}_z")
    puts = Substitute(syms={y: sym.as_expr(y2)}, fresh=False).stmt(puts)
    body = Seq((For(y, sym.as_expr(batch), Seq(tuple(loads)), "unroll"), For(y2, sym.as_expr(batch), puts, "unroll")))
    return Alloc(regs, For(b, sym.as_expr(-(-trips // batch)), body))


def unravel(flat: sym.Expr, extents: list[sym.Expr]) -> list[sym.Expr]:
    """Row-major coordinates of `flat` in a grid of `extents`."""
    out, stride = [], sym.as_expr(1)
    strides = []
    for e in reversed(extents):
        strides.append(stride)
        stride = stride * e
    strides.reverse()
    for k, (e, s) in enumerate(zip(extents, strides)):
        q = sym.floordiv(flat, s) if not (s.is_const and s.value == 1) else flat
        out.append(q if k == 0 else sym.mod(q, e))
    return out


def lower_rows(b: Block, rows: list[dict[sym.SymVar, sym.Expr]], acc_name: str, lanes: int = 0,
               guards: list[V | None] | None = None) -> Stmt:
    """`b` for several rows (a register tile): a reduction whose iterators are all fixed except
    its reduce ones runs ONE loop nest with an accumulator per row, so what the rows share (a
    dequantized weight, an input vector) is computed once per iteration; anything else is the
    rows one after another. A row with a guard (a tile's rows past the end, clamped to the last
    one so their loads stay in bounds) stores only when its guard holds."""
    if len(rows) == 1:
        return lower_block(b, rows[0], acc_name, lanes)
    guards = guards or [None] * len(rows)

    def guarded(g, st: Stmt) -> Stmt:
        return st if g is None else IfThenElse(g, st)
    free = [it for it in b.iters if it.var not in rows[0]]
    if not b.reduce or any(it.kind != "reduce" for it in free):
        return Seq(tuple(guarded(g, lower_block(b, fx, f"{acc_name}_{i}", lanes))
                         for i, (fx, g) in enumerate(zip(rows, guards))))
    loops = [(sym.SymVar(it.var.name), it.extent) for it in free]
    combine, rhs = reduction_parts(b)
    subs = [Substitute(syms={**fx, **{it.var: sym.as_expr(lv) for it, (lv, _) in zip(free, loops)}}, fresh=False)
            for fx in rows]
    stores = [sb.store(b.body) for sb in subs]
    accs = [Buffer(f"{acc_name}_{i}", (1,), st.buffer.dtype, "local") for i, st in enumerate(stores)]
    zero = (sym.as_expr(0),)
    values = [sb.value(rhs) for sb in subs]
    inits = [Store(acc, zero, sb.store(b.init).value) for acc, sb in zip(accs, subs)]
    finals = [guarded(g, Store(st.buffer, st.indices, acc[0])) for st, acc, g in zip(stores, accs, guards)]

    def nest(levels, body: Stmt) -> Stmt:
        for lv, ext in reversed(levels):
            body = For(lv, subs[0].expr(ext), body)
        return body

    (lv, extent), outer = loops[-1], loops[:-1]
    extent = sym.as_expr(subs[0].expr(extent))
    n = lanes or UNROLL
    if extent.is_const and extent.value % n and n != UNROLL:
        n = UNROLL
    if extent.is_const and extent.value % n == 0 and extent.value >= n:
        ko = sym.SymVar(f"{lv.name}o")
        body = []
        for acc, v in zip(accs, values):
            for c in range(n):
                vc = Substitute(syms={lv: sym.as_expr(ko) * n + c}, fresh=False).value(v)
                body.append(Store(acc, zero, tir.V(combine, acc.dtype, (acc[0], vc))))
        loop = nest(outer, For(ko, sym.as_expr(extent.value // n), Seq(tuple(body)), kind="lanes"))
    else:
        loop = nest(loops, Seq(tuple(Store(acc, zero, tir.V(combine, acc.dtype, (acc[0], v)))
                                     for acc, v in zip(accs, values))))
    out: Stmt = Seq((*inits, loop, *finals))
    for acc in reversed(accs):
        out = Alloc(acc, out)
    return out


def lower_block(b: Block, fixed: dict[sym.SymVar, sym.Expr], acc_name: str, lanes: int = 0) -> Stmt:
    """A block as serial loops over its iterators not in `fixed` (those become loop variables).
    A reduction accumulates in a thread-local scalar and stores once; its innermost loop is split by
    `lanes` (0: UNROLL) into a `lanes` loop whose body holds one update per lane (see _unrolled)."""
    mapping: dict[sym.SymVar, sym.Expr] = dict(fixed)
    loops: list[tuple[sym.SymVar, sym.Expr, str]] = []
    for it in b.iters:
        if it.var in fixed:
            continue
        lv = sym.SymVar(it.var.name)
        mapping[it.var] = sym.as_expr(lv)
        loops.append((lv, it.extent, it.kind))
    sub = Substitute(syms=mapping, fresh=False)

    def nest(levels, body: Stmt) -> Stmt:
        for lv, ext, _ in reversed(levels):
            body = For(lv, sub.expr(ext), body)
        return body

    store = sub.store(b.body)
    spatial = [x for x in loops if x[2] == "spatial"]
    reduce = [x for x in loops if x[2] == "reduce"]
    if not b.reduce:
        return nest(spatial, store)
    combine, rhs = reduction_parts(b)
    acc = Buffer(acc_name, (1,), store.buffer.dtype, "local")
    init = sub.store(b.init)
    zero = (sym.as_expr(0),)
    value = sub.value(rhs)
    update = Store(acc, zero, tir.V(combine, acc.dtype, (acc[0], value)))
    loop = _unrolled(reduce[-1], reduce[:-1], acc, combine, value, nest, lanes) if reduce else None
    inner = Seq((Store(acc, zero, init.value), loop or nest(reduce, update),
                 Store(store.buffer, store.indices, acc[0])))
    return nest(spatial, Alloc(acc, inner))


UNROLL = 8


def reduce_lanes(target) -> int:
    """Lanes of the split reduction loop: the target's vector width where its renderer turns a `lanes`
    loop into vector code (OpenCL: float16 on AVX-512 PoCL), else UNROLL scalar copies."""
    w = getattr(target, "vector_width", 0)
    return w if getattr(target, "vector_lanes", False) and w in (4, 8, 16) else UNROLL


def _unrolled(last, outer, acc: Buffer, combine: str, value: V, nest, lanes: int = 0) -> Stmt | None:
    """The innermost reduction loop split by `lanes` with the inner copies written out, as a For of
    kind "lanes". Each copy's index is `lanes * ko + c` with c a constant, so the canonical form folds
    the index arithmetic of packed weights ((8*ko + 3) // 8 -> ko, (8*ko + 3) % 8 -> 3) and
    neighbouring loads are adjacent; a vectorizing renderer reads lane c from copy c."""
    lv, extent, _ = last
    extent = sym.as_expr(extent)
    n = lanes or UNROLL
    if extent.is_const and extent.value % n and n != UNROLL:
        n = UNROLL
    if not extent.is_const or extent.value % n or extent.value < n:
        return None
    ko = sym.SymVar(f"{lv.name}o")
    zero = (sym.as_expr(0),)
    body = []
    for c in range(n):
        v = Substitute(syms={lv: sym.as_expr(ko) * n + c}, fresh=False).value(value)
        body.append(Store(acc, zero, tir.V(combine, acc.dtype, (acc[0], v))))
    return nest(outer, For(ko, sym.as_expr(extent.value // n), Seq(tuple(body)), kind="lanes"))


def localize(stmt: Stmt, buf: Buffer, local: Buffer | list[tuple[tuple, Buffer]], lead: int) -> Stmt:
    """Rewrite stores to and loads from `buf` as accesses to the thread-local `local`, dropping the
    first `lead` indices (the row the thread owns). With a register tile, `local` lists
    (row's leading indices, its local buffer) and each access goes to its own row's buffer."""
    rows = local if isinstance(local, list) else None

    def target(indices) -> Buffer:
        if rows is None:
            return local
        head = tuple(sym.as_expr(i) for i in indices[:lead])
        for key, loc in rows:
            if head == key:
                return loc
        raise ValueError(f"localize: {buf.name} accessed at {head}, which is no row of the tile")

    def idx(indices):
        rest = tuple(indices[lead:])
        return rest if rest else (sym.as_expr(0),)

    def value(v: V) -> V:
        def f(x: V):
            if x.op == "load" and x.arg[0] is buf:
                loc = target(x.arg[1])
                return V("load", loc.dtype, (), (loc, idx(x.arg[1])))
            return None
        return map_value(v, f)

    def visit(st: Stmt) -> Stmt:
        if isinstance(st, Seq):
            return Seq(tuple(visit(s) for s in st.stmts))
        if isinstance(st, Store):
            b = target(st.indices) if st.buffer is buf else st.buffer
            indices = idx(st.indices) if st.buffer is buf else st.indices
            return Store(b, indices, value(st.value))
        if isinstance(st, For):
            return For(st.var, st.extent, visit(st.body), st.kind, st.thread)
        if isinstance(st, Alloc):
            return Alloc(st.buffer, visit(st.body))
        if isinstance(st, IfThenElse):
            return IfThenElse(value(st.cond), visit(st.then_body), None if st.else_body is None else visit(st.else_body))
        return st
    return visit(stmt)


def split_matmul(prog) -> tuple[Block, list[Block], V] | None:
    """(matmul, epilogues, summand) of a program whose first block is a sum over one trailing reduce
    iterator (the GEMV rules' starting point), or None."""
    stmts = strip_allocs(prog.body)
    if not stmts or not all(isinstance(s, Block) for s in stmts):
        return None
    mm, epilogues = stmts[0], stmts[1:]
    if len(mm.reduce) != 1 or mm.init is None or mm.iters[-1].kind != "reduce":
        return None
    combine, rhs = reduction_parts(mm)
    return (mm, epilogues, rhs) if combine == "add" else None


def _key(v: V):
    """A value's structure, for equality of values built apart (a scale loaded at the same index for each input)."""
    if v.op == "load":
        buf, idx = v.arg
        return ("load", id(buf), tuple(_key(i) if isinstance(i, V) else str(i) for i in idx))
    return (v.op, v.dtype, str(v.arg) if v.op in ("const", "index") else None, tuple(_key(x) for x in v.src))


def _factors(v: V) -> list[V]:
    if v.op == "mul" and v.dtype.startswith("float"):
        return [f for x in v.src for f in _factors(x)]
    return [v]


def _product(factors: list[V]) -> V:
    out = None
    for f in factors:
        out = f if out is None else out * f
    return tir.const(1.0) if out is None else out


def common_factor(parts: list[V]) -> tuple[V, list[V]] | None:
    """parts[i] = common * rests[i], the common factor a product of the factors every part has (a group's scale,
    the same for the V inputs of a lane's step): (common, rests), or None where they share none. A GEMV multiplies
    the common factor once into the rests' sum rather than into each part (schedule/gemv.py)."""
    if len(parts) < 2:
        return None
    split = [_factors(p) for p in parts]
    keys = [[_key(f) for f in fs] for fs in split]
    shared = [k for k in dict.fromkeys(keys[0]) if all(k in ks for ks in keys[1:])]
    if not shared:
        return None
    rests = []
    for fs in split:
        left = list(fs)
        for k in shared:
            del left[[_key(x) for x in left].index(k)]
        rests.append(_product(left))
    return _product([split[0][keys[0].index(k)] for k in shared]), rests


def offset_out(rests: list[V]) -> tuple[V, V, V] | None:
    """rests[i] = P_i * (a_i - c), c one constant for all (a 4-bit code's zero point, 8): (sum of P_i a_i, c, sum of
    P_i), whose difference sum - c * sum is theirs: a GEMV sums the codes' products and the inputs apart, and
    subtracts the zero point once (P_i, a lane's inputs, the same for its rows). None where they are not so."""
    split = [_factors(r) for r in rests]
    found = []
    for fs in split:
        j = next((i for i, f in enumerate(fs) if f.op == "sub" and f.src[1].op == "const"), None)
        if j is None:
            return None
        found.append(j)
    consts = {str(fs[j].src[1].arg) for fs, j in zip(split, found)}
    if len(consts) != 1:
        return None
    others = [_product([f for i, f in enumerate(fs) if i != j]) for fs, j in zip(split, found)]
    return (sum_of([p * fs[j].src[0] for p, fs, j in zip(others, split, found)]), split[0][found[0]].src[1],
            sum_of(others))


def sum_of(values: list[V]) -> V:
    out = values[0]
    for v in values[1:]:
        out = out + v
    return out


def hoist_factor(v: V, buf: Buffer) -> tuple[V, V] | None:
    """v = rest * factor along a chain of products, where `factor` reads `buf` and nothing else and `rest` does not read
    it: (rest, factor), or None. An RMS norm's output inlined into a matmul's summand, w[k] * (x[k] * rsqrt(s / K +
    eps)) * W[n, k], gives (w[k] * x[k] * W[n, k], rsqrt(s / K + eps))."""
    def reads(u: V) -> bool:
        return any(ld.arg[0] is buf for ld in tir.loads(u))
    if v.op != "mul" or not reads(v):
        return None
    a, b = v.src
    if reads(a) and reads(b):
        return None
    if reads(a):
        a, b = b, a
    if all(ld.arg[0] is buf for ld in tir.loads(b)):
        return a, b
    got = hoist_factor(b, buf)
    return None if got is None else (V("mul", v.dtype, (a, got[0])), got[1])


def split_stat_matmul(prog) -> tuple[Block, Block, list[Block], V, V] | None:
    """(statistic, matmul, epilogues, summand without the factor, factor) of a program (transform/inline_prologue.py's
    norm folded into a decode GEMV) whose first block sums one row over K into a local buffer from 0 (an RMS norm's
    sum of squares) and whose second is a matmul over the same K whose summand is a product with a factor of that sum
    alone (rsqrt(sum / K + eps)): the GEMV accumulates the sum beside its rows' and scales their sums by the factor
    once (schedule/gemv.py). None for any other program."""
    stmts = strip_allocs(prog.body)
    if len(stmts) < 2 or not all(isinstance(s, Block) for s in stmts):
        return None
    stat, mm, epilogues = stmts[0], stmts[1], stmts[2:]
    if len(stat.reduce) != 1 or stat.init is None or len(mm.reduce) != 1 or mm.init is None:
        return None
    buf = stat.body.buffer
    if (buf.scope != "local" or buf not in allocs_of(prog.body)
            or stat.iters[-1].kind != "reduce" or mm.iters[-1].kind != "reduce"
            or not all(sym.as_expr(it.extent).is_const and sym.as_expr(it.extent).value == 1 for it in stat.spatial)
            or stat.init.value.op != "const" or stat.init.value.arg != 0
            or not sym.prove_eq(stat.reduce[0].extent, mm.reduce[0].extent)):
        return None
    combine_stat, stat_rhs = reduction_parts(stat)
    combine, rhs = reduction_parts(mm)
    got = hoist_factor(rhs, buf) if combine_stat == "add" and combine == "add" else None
    if got is None or any(ld.arg[0] is buf for e in epilogues for ld in tir.loads(e.body.value)):
        return None
    return stat, mm, epilogues, got[0], got[1]


def matmul_with_epilogues(mm: Block, epilogues: list[Block], intermediates: list[Buffer]) -> bool:
    """The shape both matmul rules need: the only intermediate is the matmul's result, and every
    later block is an elementwise epilogue over the same output domain reading it at its own index."""
    out, spatial = mm.body.buffer, mm.spatial
    if any(b is not out for b in intermediates):
        return False
    for e in epilogues:
        if e.reduce or len(e.iters) != len(spatial) or not all(
                sym.prove_eq(a.extent, b.extent) for a, b in zip(e.iters, spatial)):
            return False
        for ld in tir.loads(e.body.value):
            if ld.arg[0] is out and tuple(ld.arg[1]) != tuple(e.body.indices):
                return False
    return True
