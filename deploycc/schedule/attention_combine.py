"""The combine of flash-decoding's partials (schedule/attention.py's split form): a block's threads' partials in
shared memory (merge), and a row's split blocks' partials from the workspace, by the last block to arrive (CUDA) or by
a second kernel (combine_partials, combine_splits)."""
from __future__ import annotations

from ..ir import sym, tir
from ..ir.kernel import Kernel, free_syms, global_buffers
from ..ir.tir import Alloc, Buffer, For, IfThenElse, Seq, Stmt, Store
from .lowering import thread_grid

NEG = -1e30  # a finite -infinity: exp(NEG - s) == 0, and fast-math builds may assume no infinities
COMBINE_BATCH = 8  # partials a trip of the last block's combine (CUDA), their loads in flight together,
COMBINE_REGISTERS = 16  # fewer where a thread's outputs times them pass this (each three registers)


def merge(n, m_of, l_of, acc_of, into) -> Stmt:
    """Flash-decoding's combine of n partials (maximum m, sum l, accumulator element acc each): into = (mx, tot, out)
    gets the largest maximum, and the sums and accumulator elements each weighed by exp(its m - mx)."""
    mx, tot, out = into
    z = (sym.as_expr(0),)
    w = lambda v: tir.unary("exp", m_of(v) - mx[0])  # noqa: E731

    def over(f) -> Stmt:
        v = sym.SymVar("v")
        return For(v, sym.as_expr(n), f(sym.as_expr(v)))
    return Seq((
        Store(mx, z, tir.const(NEG)),
        over(lambda v: Store(mx, z, tir.vmax(mx[0], m_of(v)))),
        Store(tot, z, tir.const(0.0)), Store(out, z, tir.const(0.0)),
        over(lambda v: Seq((Store(tot, z, tot[0] + l_of(v) * w(v)), Store(out, z, out[0] + acc_of(v) * w(v))))),
    ))


def combine_partials(part: Buffer, S: sym.Expr, W: int, E: int, output) -> tuple[Stmt, sym.Expr]:
    """A thread's E outputs, each from S partials (maximum, sum, then the accumulator's elements, W apart), and the
    round trips to memory it makes. output(cc) -> (where output cc's first partial starts, its element, a store of
    its value, a guard or None). One pass over the partials (the online softmax's update: the maximum and the sums
    rescaled as each partial comes), the outputs side by side, `batch` partials a trip: the trip's loads first, into
    registers (a partial past S loads the last one again and weighs nothing), then their updates, so the loads are in
    flight together (nvcc's SASS for sm_90 issues a trip's 16 before the first update; with a guard per partial it
    branched around each): S / batch round trips, not the 2 S of merge() one output after another."""
    batch = max(1, min(COMBINE_BATCH, COMBINE_REGISTERS // E))
    cc, s_, j_ = sym.SymVar("cc"), sym.SymVar("s"), sym.SymVar("j")
    row0, c, store, guard = output(sym.as_expr(cc))
    at = sym.as_expr(s_) * batch + j_  # the partial
    base = row0 + sym.smin(at, S - 1) * W
    rm, rt, ro = (Buffer(x, (E,), "float32", "local") for x in ("rm", "rt", "ro"))
    lm, ll, la = (Buffer(x, (batch * E,), "float32", "local") for x in ("lm", "ll", "la"))
    nm, wa, wb = (Buffer(x, (1,), "float32", "local") for x in ("nm", "wa", "wb"))
    z, k_, kj = (sym.as_expr(0),), (sym.as_expr(cc),), (sym.as_expr(j_) * E + cc,)

    def each(f) -> Stmt:
        return For(cc, sym.as_expr(E), IfThenElse(guard, f()) if guard is not None else f(), "unroll")

    def over_batch(f) -> Stmt:
        return For(j_, sym.as_expr(batch), each(f), "unroll")
    ok = tir.index(at).cmp("lt", tir.index(S))
    load = over_batch(lambda: Seq((Store(lm, kj, part[base]), Store(ll, kj, part[base + 1]),
                                   Store(la, kj, part[base + 2 + c]))))
    update = over_batch(lambda: Seq((
        Store(nm, z, tir.select(ok, tir.vmax(rm[k_], lm[kj]), rm[k_])),
        Store(wa, z, tir.unary("exp", rm[k_] - nm[0])),
        Store(wb, z, tir.select(ok, tir.unary("exp", lm[kj] - nm[0]), tir.const(0.0))),
        Store(rt, k_, rt[k_] * wa[0] + ll[kj] * wb[0]),
        Store(ro, k_, ro[k_] * wa[0] + la[kj] * wb[0]),
        Store(rm, k_, nm[0]))))
    trips = sym.floordiv(S + (batch - 1), batch)
    body = Seq((each(lambda: Seq((Store(rm, k_, tir.const(NEG)), Store(rt, k_, tir.const(0.0)),
                                 Store(ro, k_, tir.const(0.0))))),
                For(s_, trips, Seq((load, update))),
                each(lambda: store(ro[k_] / rt[k_]))))
    for buf in (rm, rt, ro, lm, ll, la, nm, wa, wb):
        body = Alloc(buf, body)
    return body, trips


def combine_splits(O: Buffer, target, part: Buffer, S: sym.Expr, W: int, name: str) -> Kernel:
    """The second kernel of the split form (where the target's work-groups do not count their arrivals): output
    element (query, head, c) of the attention's output O from its S partials, one thread each (combine_partials)."""
    n, h, D = O.shape[0], O.shape[1], O.shape[2].value

    def body_of(x):
        r, c = sym.floordiv(x, D), sym.mod(x, D)  # r: the (head, query) row, as the partials' blocks number them
        at = (sym.mod(r, n), sym.floordiv(r, n), c)
        return combine_partials(part, S, W, 1, lambda cc: (r * S * W, c, lambda v: Store(O, at, v), None))[0]

    body, groups = thread_grid(h * n * D, target.threads_per_block, body_of)
    bufs, written = global_buffers(body, [part, O])
    return Kernel(name, bufs, tuple(free_syms(body)), body, groups, target.threads_per_block, written)
