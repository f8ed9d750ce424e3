"""Rule: tiled matmul for prefill, with operand tiles in shared/local memory, plus its epilogue.

Applies to a program whose first block is a matmul (`C[rows, col] += A(rows, k) * B(col, k)`,
where A and B may be inlined prologues such as a dequantize) followed only by elementwise
epilogue blocks over the same output. A work-group of 16 x 16 threads computes a 64 x 64 output tile,
each thread 4 x 4 outputs in registers (register blocking, as every SIMT GEMM since Volkov and Demmel's):
per K step of 16 the threads stage A's 64 x 16 and B's 64 x 16 in shared memory (a dequantize inlined in
B runs once per weight, in the staging), a barrier, then 16 steps of 4 + 4 shared loads for 16
multiply-adds, and a barrier before the next staging. Before (until 2026-11-27) a 16 x 16 tile made one
output a thread: 2 shared loads per multiply-add and two barriers per 16 of K for 256 outputs, 16 times
the barriers per multiply-add (which is what a CPU running GPU kernels, lavapipe or PoCL, pays most for).
Tails (M, N, K not multiples of the tile) are guarded, with zeros staged. Decode (a single row) is left to
the GEMV rules; a few rows known only at run time, to dispatch.py.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..ir import sym, tir
from ..ir.kernel import Kernel, Schedule, _value_syms, allocs_of, free_syms, global_buffers, strip_allocs
from ..ir.tir import Alloc, Barrier, Block, Buffer, For, IfThenElse, IterVar, Seq, Stmt, Store, TensorProgram
from ..ir.tir_interp import reduction_parts
from ..ir.tir_rewrite import Substitute
from .lowering import localize, lower_block, matmul_with_epilogues, unravel

TILE = 16  # the fewest rows a constant-row program needs to take the tiles (below: the GEMVs)
SIDE = 16  # a block is SIDE x SIDE threads
TM = TN = 4  # each makes TM x TN outputs, in registers
BM, BN, BK = SIDE * TM, SIDE * TN, 16  # a block's 64 x 64 outputs, K staged 16 at a time
THREADS = SIDE * SIDE
LD = BM + 1  # a staged tile is k-major, one float of padding a row: its transposed stores fall in different banks


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

    def at_row(self, m: sym.Expr) -> dict:
        """The row iterators' values at flat row m."""
        return {it.var: v for it, v in zip(self.rows, unravel(m, [it.extent for it in self.rows]))}

    def a_at(self, m: sym.Expr, k: sym.Expr) -> tir.V:
        return Substitute(syms={**self.at_row(m), self.red.var: k}, fresh=False).value(self.fa)

    def b_at(self, n: sym.Expr, k: sym.Expr) -> tir.V:
        return Substitute(syms={self.col.var: n, self.red.var: k}, fresh=False).value(self.fb)

    def tiles(self, bm: int, bn: int, g: sym.Expr) -> tuple[sym.Expr, sym.Expr, sym.Expr]:
        """(work-groups, first row, first column of group g) for output tiles of bm x bn."""
        tiles_n = sym.floordiv(sym.as_expr(self.col.extent) + (bn - 1), bn)
        return (sym.floordiv(self.m_total + (bm - 1), bm) * tiles_n, sym.floordiv(g, tiles_n) * bm,
                sym.mod(g, tiles_n) * bn)

    def tail(self, row: sym.Expr, col: sym.Expr, value: tir.V) -> Stmt:
        """Output (flat row `row`, column `col`) = the matmul's initial value + `value`, then the epilogues there (an
        intermediate result kept in a register). The caller guards the edges."""
        mm, out = self.mm, self.mm.body.buffer
        fixed = {**self.at_row(row), self.col.var: col}
        sub = Substitute(syms=fixed, fresh=False)
        result = Store(out, tuple(sub.expr(x) for x in mm.body.indices), sub.value(mm.init.value) + value)
        stmt: Stmt = Seq((result,) + tuple(
            lower_block(ep, {a.var: fixed[b.var] for a, b in zip(ep.iters, mm.spatial)}, f"e{q}")
            for q, ep in enumerate(self.epilogues)))
        if out in self.intermediates:
            local = Buffer(out.name, (1,), out.dtype, "local")
            stmt = Alloc(local, localize(stmt, out, local, len(out.shape)))
        return stmt


def staged(buf: Buffer, value_at, bound: sym.Expr, first: sym.Expr, k_ext: sym.Expr, kt: sym.Expr, t: sym.Expr,
           threads: int, rows: int, bk: int, at) -> Stmt:
    """buf[at(r, kk)] = the operand at (first + r, kt * bk + kk) for a K step's rows x bk elements, rows * bk / threads
    a thread, read along k (a warp's loads coalesce); zero past the operand's rows or K. `at` is the staged layout."""
    e = sym.SymVar("e")
    flat = sym.as_expr(e) * threads + t
    r, kk = sym.floordiv(flat, bk), sym.mod(flat, bk)
    k = kt * bk + kk
    inside = tir.V("and", "bool", (tir.index(first + r).cmp("lt", tir.index(bound)),
                                   tir.index(k).cmp("lt", tir.index(k_ext))))
    return For(e, sym.as_expr(rows * bk // threads), IfThenElse(inside, Store(buf, (at(r, kk),), value_at(first + r, k)),
                                                                Store(buf, (at(r, kk),), tir.const(0.0))))


class Prefetch:
    """A K step's staging split in two: its operand elements (loaded, and dequantized where the operand says so) into
    registers (`load(kt)`: rows and k clamped into the operand, so that every load is valid unguarded), issued
    before the current step's products so that their round trip to memory overlaps them; then, at the next step,
    the registers into the staged tile (`store(kt)`: zeros past the operand's rows or K). Software pipelining with
    registers, as CUTLASS's GEMMs for sm_70 stage their tiles (mma.py's PREFETCH)."""

    def __init__(self, name: str, buf: Buffer, value_at, bound: sym.Expr, first: sym.Expr, k_ext: sym.Expr,
                 t: sym.Expr, threads: int, rows: int, bk: int, at):
        self.trips = rows * bk // threads
        self.regs = Buffer(name, (self.trips,), "float32", "local")
        self.buf, self.value_at, self.bound, self.first, self.k_ext, self.bk, self.at = (
            buf, value_at, bound, first, k_ext, bk, at)
        self.where = [(sym.floordiv(sym.as_expr(e * threads) + t, bk), sym.mod(sym.as_expr(e * threads) + t, bk))
                      for e in range(self.trips)]

    def load(self, kt: sym.Expr) -> Stmt:
        return Seq(tuple(
            Store(self.regs, (sym.as_expr(e),), self.value_at(sym.smin(self.first + r, self.bound - 1),
                                                              sym.smin(kt * self.bk + kk, self.k_ext - 1)))
            for e, (r, kk) in enumerate(self.where)))

    def store(self, kt: sym.Expr) -> Stmt:
        out = []
        for e, (r, kk) in enumerate(self.where):
            inside = tir.V("and", "bool", (tir.index(self.first + r).cmp("lt", tir.index(self.bound)),
                                           tir.index(kt * self.bk + kk).cmp("lt", tir.index(self.k_ext))))
            out.append(Store(self.buf, (self.at(r, kk),), tir.select(inside, self.regs[sym.as_expr(e)], tir.const(0.0))))
        return Seq(tuple(out))


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
    if not target.tiled_matmul or target.max_threads_per_block < THREADS:
        return None
    if 2 * BK * LD * 4 > target.max_shared_memory:  # As and Bs
        return None
    p = prefill_matmul(prog, TILE)
    if p is None:
        return None
    n_ext, k_ext, m_total = sym.as_expr(p.col.extent), sym.as_expr(p.red.extent), p.m_total
    g, t, kt, kk = (sym.SymVar(x) for x in ("g", "t", "kt", "kk"))
    G, Tt, KT, KK = (sym.as_expr(x) for x in (g, t, kt, kk))
    groups, m0, n0 = p.tiles(BM, BN, G)
    ty, tx = sym.floordiv(Tt, SIDE), sym.mod(Tt, SIDE)
    As = Buffer("As", (BK * LD,), "float32", "shared")
    Bs = Buffer("Bs", (BK * LD,), "float32", "shared")
    acc = Buffer("acc", (TM * TN,), "float32", "local")
    a_r = Buffer("a_r", (TM,), "float32", "local")
    b_r = Buffer("b_r", (TN,), "float32", "local")
    c = sym.as_expr

    def stage(buf: Buffer, value_at, bound: sym.Expr, first: sym.Expr) -> Stmt:  # k-major: kk * LD + r
        return staged(buf, value_at, bound, first, k_ext, KT, Tt, THREADS, BM, BK, lambda r, kq: kq * LD + r)

    # thread (ty, tx) makes rows ty + SIDE i and columns tx + SIDE j of the tile: a step's reads of a column of As are
    # one address for a row of threads (a broadcast), of Bs consecutive addresses
    products = Seq((
        *[Store(a_r, (c(i),), As[KK * LD + ty + SIDE * i]) for i in range(TM)],
        *[Store(b_r, (c(j),), Bs[KK * LD + tx + SIDE * j]) for j in range(TN)],
        *[Store(acc, (c(i * TN + j),), acc[i * TN + j] + a_r[i] * b_r[j]) for i in range(TM) for j in range(TN)],
    ))
    step = Seq((stage(As, p.a_at, m_total, m0), stage(Bs, p.b_at, n_ext, n0), Barrier(),
                For(kk, c(BK), products), Barrier()))
    tails = []
    for i in range(TM):
        for j in range(TN):
            row, colv = m0 + ty + SIDE * i, n0 + tx + SIDE * j
            in_range = tir.V("and", "bool", (tir.index(row).cmp("lt", tir.index(m_total)),
                                             tir.index(colv).cmp("lt", tir.index(n_ext))))
            tails.append(IfThenElse(in_range, p.tail(row, colv, acc[i * TN + j])))
    body: Stmt = Seq((
        *[Store(acc, (c(q),), tir.const(0.0)) for q in range(TM * TN)],
        For(kt, sym.floordiv(k_ext + (BK - 1), BK), step),
        *tails,
    ))
    for buf in (b_r, a_r, acc, Bs, As):
        body = Alloc(buf, body)
    body = For(g, groups, For(t, c(THREADS), body, "thread", "local"), "thread", "group")
    bufs, written = global_buffers(body, list(prog.params))
    k = Kernel(prog.name, bufs, tuple(free_syms(body)), body, groups, THREADS, written)
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
