"""Rule: one thread per row, every block of the program in that thread.

"Rows" are the leading spatial iterators that all blocks share (same extents, stores and
dependent loads indexed by them first), so a thread needs nothing another thread computes. It fits
matmul/GEMV with epilogues (a row is one output element: one row per work-item, which FACTS.md
measured as the fast layout on PoCL), rms_norm/layer_norm/softmax (a row is one vector, the
statistics stay in registers), and multi-block injective programs (rotary halves). Intermediates
left by fusion become thread-local arrays when their per-row part has a constant size.
"""
from __future__ import annotations

from ..ir import sym
from ..ir.kernel import Kernel, Schedule, allocs_of, free_syms, global_buffers, strip_allocs
from ..ir.tir import Alloc, Block, Buffer, Seq, Stmt, TensorProgram, loads
from .lowering import localize, lower_block, thread_grid, unravel


def rule(prog: TensorProgram, target) -> Schedule | None:
    stmts = strip_allocs(prog.body)
    if not stmts or not all(isinstance(s, Block) for s in stmts):
        return None
    blocks: list[Block] = stmts
    intermediates = allocs_of(prog.body)
    p = _common_rows(blocks, intermediates + list(prog.outputs))
    if p == 0:
        return None
    locals_: list[tuple[Buffer, Buffer]] = []
    for buf in intermediates:
        rest = buf.shape[p:]
        if not all(d.is_const for d in rest):
            return None
        locals_.append((buf, Buffer(buf.name, rest or (1,), buf.dtype, "local")))
    extents = [it.extent for it in blocks[0].iters[:p]]
    total = sym.as_expr(1)
    for e in extents:
        total = total * e

    def body_of(r: sym.Expr) -> Stmt:
        rows = unravel(r, extents)
        parts = [lower_block(b, {it.var: rv for it, rv in zip(b.iters[:p], rows)}, f"acc{k}")
                 for k, b in enumerate(blocks)]
        out: Stmt = Seq(tuple(parts))
        for buf, local in locals_:
            out = Alloc(local, localize(out, buf, local, p))
        return out

    body, groups = thread_grid(total, target.threads_per_block, body_of)
    bufs, written = global_buffers(body, list(prog.params))
    k = Kernel(prog.name, bufs, tuple(free_syms(body)), body, groups, target.threads_per_block, written)
    return Schedule((k,), (), "row")


def _common_rows(blocks: list[Block], dependent: list[Buffer]) -> int:
    """The largest p such that every block's first p iterators are spatial with the same extents,
    every store is at those iterators first, and every load of a buffer the program writes reads
    the reader's own row."""
    n = min(len(b.iters) for b in blocks)
    p = 0
    while p < n:
        its = [b.iters[p] for b in blocks]
        if any(it.kind != "spatial" for it in its) or any(not sym.prove_eq(it.extent, its[0].extent) for it in its):
            break
        p += 1
    written = {b.body.buffer for b in blocks} | set(dependent)
    while p > 0 and not all(_row_local(b, p, written) for b in blocks):
        p -= 1
    return p


def _row_local(b: Block, p: int, written: set) -> bool:
    lead = [it.var for it in b.iters[:p]]

    def ok(indices) -> bool:
        return len(indices) >= p and all(isinstance(i, sym.Expr) and i.as_var is v for i, v in zip(indices, lead))

    if not ok(b.body.indices) or (b.init is not None and not ok(b.init.indices)):
        return False
    for st in (b.body, b.init):
        if st is None:
            continue
        for ld in loads(st.value):
            if ld.arg[0] in written and not ok(ld.arg[1]):
                return False
    return True
