"""Shared lowering steps for schedule rules: thread loops, blocks to serial loops, local buffers."""
from __future__ import annotations

from ..ir import sym, tir
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


def lower_block(b: Block, fixed: dict[sym.SymVar, sym.Expr], acc_name: str) -> Stmt:
    """A block as serial loops over its iterators not in `fixed` (those become loop variables).
    A reduction accumulates in a thread-local scalar and stores once."""
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
    loop = _unrolled(reduce[-1], reduce[:-1], acc, combine, value, nest) if reduce else None
    inner = Seq((Store(acc, zero, init.value), loop or nest(reduce, update),
                 Store(store.buffer, store.indices, acc[0])))
    return nest(spatial, Alloc(acc, inner))


UNROLL = 8


def _unrolled(last, outer, acc: Buffer, combine: str, value: V, nest) -> Stmt | None:
    """The innermost reduction loop split by UNROLL with the inner copies written out. Each copy's
    index is `UNROLL * ko + c` with c a constant, so the canonical form folds the index arithmetic of
    packed weights ((8*ko + 3) // 8 -> ko, (8*ko + 3) % 8 -> 3) and neighbouring loads are adjacent."""
    lv, extent, _ = last
    extent = sym.as_expr(extent)
    if not extent.is_const or extent.value % UNROLL or extent.value < UNROLL:
        return None
    ko = sym.SymVar(f"{lv.name}o")
    zero = (sym.as_expr(0),)
    body = []
    for c in range(UNROLL):
        v = Substitute(syms={lv: sym.as_expr(ko) * UNROLL + c}, fresh=False).value(value)
        body.append(Store(acc, zero, tir.V(combine, acc.dtype, (acc[0], v))))
    return nest(outer, For(ko, sym.as_expr(extent.value // UNROLL), Seq(tuple(body))))


def localize(stmt: Stmt, buf: Buffer, local: Buffer, lead: int) -> Stmt:
    """Rewrite stores to and loads from `buf` as accesses to the thread-local `local`, dropping the
    first `lead` indices (the row the thread owns)."""
    def idx(indices):
        rest = tuple(indices[lead:])
        return rest if rest else (sym.as_expr(0),)

    def value(v: V) -> V:
        def f(x: V):
            if x.op == "load" and x.arg[0] is buf:
                return V("load", local.dtype, (), (local, idx(x.arg[1])))
            return None
        return map_value(v, f)

    def visit(st: Stmt) -> Stmt:
        if isinstance(st, Seq):
            return Seq(tuple(visit(s) for s in st.stmts))
        if isinstance(st, Store):
            b = local if st.buffer is buf else st.buffer
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
