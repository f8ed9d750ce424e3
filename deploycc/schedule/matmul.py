"""Rule: tiled matmul for prefill, with operand tiles in shared/local memory, plus its epilogue.

Applies to a program whose first block is a matmul (`C[rows, col] += A(rows, k) * B(col, k)`,
where A and B may be inlined prologues such as a dequantize) followed only by elementwise
epilogue blocks over the same output. A work-group of T x T threads computes a T x T output tile;
for each K tile every thread stages one element of A and one of B in shared memory, a barrier
follows, and the tile's products accumulate in a register. Tails (M, N, K not multiples of T) are
guarded, with zeros staged. Decode (a single row) is left to the row rule, which is a GEMV.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import sym, tir
from ..ir.kernel import Kernel, Schedule, _value_syms, allocs_of, free_syms, global_buffers, strip_allocs
from ..ir.tir import Alloc, Barrier, Block, Buffer, For, IfThenElse, IterVar, Seq, Store, TensorProgram
from ..ir.tir_interp import reduction_parts
from ..ir.tir_rewrite import Substitute
from .lowering import localize, lower_block, matmul_with_epilogues, unravel

TILE = 16


@dataclass
class Prefill:
    """A program both prefill rules take (this one and mma.py): its matmul `out[rows, col] += fa(rows, k) *
    fb(col, k)` over M = m_total rows, then elementwise epilogues."""

    mm: Block
    epilogues: list
    rows: list
    col: IterVar
    red: IterVar
    m_total: sym.Expr
    fa: tir.V
    fb: tir.V
    intermediates: list


def prefill_matmul(prog: TensorProgram, min_rows: int) -> Prefill | None:
    """The program's matmul with epilogues, or None (also when M is a constant below min_rows: decode's GEMV)."""
    stmts = strip_allocs(prog.body)
    if not stmts or not all(isinstance(s, Block) for s in stmts):
        return None
    mm, epilogues = stmts[0], stmts[1:]
    if len(mm.reduce) != 1 or mm.init is None:
        return None
    combine, rhs = reduction_parts(mm)
    if combine != "add" or rhs.op != "mul":
        return None
    spatial = mm.spatial
    if len(spatial) < 2 or [it.kind for it in mm.iters] != ["spatial"] * len(spatial) + ["reduce"]:
        return None
    rows, col, red = spatial[:-1], spatial[-1], mm.reduce[0]
    m_total = sym.as_expr(1)
    for it in rows:
        m_total = m_total * it.extent
    if m_total.is_const and m_total.value < min_rows:
        return None  # decode: a GEMV, the row rule's job
    fa, fb = _split(rhs, {it.var for it in rows}, col.var)
    if fa is None:
        return None
    intermediates = allocs_of(prog.body)
    if not matmul_with_epilogues(mm, epilogues, intermediates):
        return None
    return Prefill(mm, epilogues, rows, col, red, m_total, fa, fb, intermediates)


def rule(prog: TensorProgram, target) -> Schedule | None:
    if not target.tiled_matmul or target.max_threads_per_block < TILE * TILE:
        return None
    p = prefill_matmul(prog, TILE)
    if p is None:
        return None
    mm, epilogues, rows, col, red, m_total, fa, fb, intermediates = (
        p.mm, p.epilogues, p.rows, p.col, p.red, p.m_total, p.fa, p.fb, p.intermediates)
    spatial, col_var, out = mm.spatial, col.var, mm.body.buffer
    T = TILE
    n_ext, k_ext = col.extent, red.extent
    tiles_n = sym.floordiv(n_ext + (T - 1), T)
    groups = sym.floordiv(m_total + (T - 1), T) * tiles_n
    g, t, kt, kk = (sym.SymVar(x) for x in ("g", "t", "kt", "kk"))
    G, Tt, KT, KK = (sym.as_expr(x) for x in (g, t, kt, kk))
    ty, tx = sym.floordiv(Tt, T), sym.mod(Tt, T)
    row = sym.floordiv(G, tiles_n) * T + ty
    col_e = sym.mod(G, tiles_n) * T + tx
    col_b = sym.mod(G, tiles_n) * T + ty  # the B row this thread stages
    k_e = KT * T + tx
    As = Buffer("As", (T, T), "float32", "shared")
    Bs = Buffer("Bs", (T, T), "float32", "shared")
    acc = Buffer("acc", (1,), "float32", "local")
    z = (sym.as_expr(0),)

    def operand(f, mapping):
        return Substitute(syms=mapping, fresh=False).value(f)

    row_vals = unravel(row, [it.extent for it in rows])
    a_val = operand(fa, {**{it.var: v for it, v in zip(rows, row_vals)}, red.var: k_e})
    b_val = operand(fb, {col_var: col_b, red.var: k_e})
    k_ok = tir.index(k_e).cmp("lt", tir.index(k_ext))
    stage = Seq((
        IfThenElse(tir.V("and", "bool", (tir.index(row).cmp("lt", tir.index(m_total)), k_ok)),
                   Store(As, (ty, tx), a_val), Store(As, (ty, tx), tir.const(0.0))),
        IfThenElse(tir.V("and", "bool", (tir.index(col_b).cmp("lt", tir.index(n_ext)), k_ok)),
                   Store(Bs, (ty, tx), b_val), Store(Bs, (ty, tx), tir.const(0.0))),
        Barrier(),
        For(kk, sym.as_expr(T), Store(acc, z, acc[0] + As[ty, KK] * Bs[tx, KK])),
        Barrier(),
    ))
    fixed = {**{it.var: v for it, v in zip(rows, row_vals)}, col_var: col_e}
    init_val = Substitute(syms=fixed, fresh=False).value(mm.init.value)
    result_store = Store(out, tuple(Substitute(syms=fixed, fresh=False).expr(i) for i in mm.body.indices), acc[0])
    tail = Seq((result_store,) + tuple(lower_block(e, {a.var: fixed[b.var] for a, b in zip(e.iters, spatial)}, f"e{i}")
                                         for i, e in enumerate(epilogues)))
    if out in intermediates:
        local = Buffer(out.name, (1,), out.dtype, "local")
        tail = Alloc(local, localize(tail, out, local, len(out.shape)))
    in_range = tir.V("and", "bool", (tir.index(row).cmp("lt", tir.index(m_total)),
                                     tir.index(col_e).cmp("lt", tir.index(n_ext))))
    body = Alloc(As, Alloc(Bs, Alloc(acc, Seq((
        Store(acc, z, init_val),
        For(kt, sym.floordiv(k_ext + (T - 1), T), stage),
        IfThenElse(in_range, tail),
    )))))
    body = For(g, groups, For(t, sym.as_expr(T * T), body, "thread", "local"), "thread", "group")
    bufs, written = global_buffers(body, list(prog.params))
    k = Kernel(prog.name, bufs, tuple(free_syms(body)), body, groups, T * T, written)
    return Schedule((k,), (), "matmul")


def _split(rhs, row_vars: set, col_var):
    """(A factor, B factor): A must not read the output column, B must not read the output rows."""
    def uses(v, vars_):
        return any(isinstance(e, sym.Expr) and (e.free_vars() & vars_) for e in _value_syms(v))

    x, y = rhs.src
    for a, b in ((x, y), (y, x)):
        if not uses(a, {col_var}) and not uses(b, row_vars):
            return a, b
    return None, None
