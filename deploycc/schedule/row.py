"""Rule: one thread per row, every block of the program in that thread.

"Rows" are the leading spatial iterators that all blocks share (same extents, stores and
dependent loads indexed by them first), so a thread needs nothing another thread computes. It fits
matmul/GEMV with epilogues (a row is one output element: one row per work-item, which FACTS.md
measured as the fast layout on PoCL), rms_norm/layer_norm/softmax (a row is one vector, the
statistics stay in registers), and multi-block injective programs (rotary halves). Intermediates
left by fusion become thread-local arrays when their per-row part has a constant size.
"""
from __future__ import annotations

from ..ir import sym, tir
from ..ir.kernel import Kernel, Schedule, allocs_of, free_syms, global_buffers, strip_allocs
from ..ir.tir import Alloc, Block, Buffer, Seq, Stmt, TensorProgram, V, loads
from .lowering import localize, lower_rows, reduce_lanes, thread_grid, unravel


def row_form(prog: TensorProgram) -> tuple[list[Block], list[Buffer], int] | None:
    """(blocks, intermediates, p) when the program is blocks alone sharing p >= 1 leading row iterators."""
    stmts = strip_allocs(prog.body)
    if not stmts or not all(isinstance(s, Block) for s in stmts):
        return None
    intermediates = allocs_of(prog.body)
    p = _common_rows(stmts, intermediates + list(prog.outputs))
    return (stmts, intermediates, p) if p else None


def rule(prog: TensorProgram, target) -> Schedule | None:
    found = row_form(prog)
    if found is None:
        return None
    blocks, intermediates, p = found
    if _whole_rows(blocks, p, target):
        p -= 1
    locals_: list[tuple[Buffer, Buffer]] = []
    for buf in intermediates:
        rest = buf.shape[p:]
        if not all(d.is_const for d in rest):
            return None
        locals_.append((buf, Buffer(buf.name, rest or (1,), buf.dtype, "local")))
    extents = [it.extent for it in blocks[0].iters[:p]]
    lanes = reduce_lanes(target)
    tiles = _tiles(blocks, extents, p, target)
    grid = list(extents)
    for dim, t in tiles:
        grid[dim] = sym.floordiv(sym.as_expr(extents[dim]) + (t - 1), t)
    total = sym.as_expr(1)
    for e in grid:
        total = total * e

    def body_of(r: sym.Expr) -> Stmt:
        coords = unravel(r, grid)
        tile_rows: list[tuple[list, V | None]] = [(list(coords), None)]
        for dim, t in tiles:  # rows past the end read the last row (clamped) and store nothing
            e = sym.as_expr(extents[dim])
            exact = e.is_const and e.value % t == 0
            nxt = []
            for rows, guard in tile_rows:
                for i in range(t):
                    c, at = list(rows), coords[dim] * t + i
                    c[dim] = at if exact else sym.smin(at, e - 1)
                    g = guard
                    if not exact and i > 0:
                        inside = tir.index(at).cmp("lt", tir.index(e))
                        g = inside if g is None else V("and", "bool", (g, inside))
                    nxt.append((c, g))
            tile_rows = nxt
        guards = [g for _, g in tile_rows]
        tile_rows = [rows for rows, _ in tile_rows]
        tile = len(tile_rows)
        parts = [lower_rows(b, [{it.var: rv for it, rv in zip(b.iters[:p], rows)} for rows in tile_rows],
                            f"acc{k}", lanes, guards) for k, b in enumerate(blocks)]
        out: Stmt = Seq(tuple(parts))
        for buf, local in locals_:
            if tile == 1:
                out = Alloc(local, localize(out, buf, local, p))
                continue
            per_row = [(tuple(sym.as_expr(x) for x in rows), Buffer(f"{buf.name}_{i}", local.shape, local.dtype, "local"))
                       for i, rows in enumerate(tile_rows)]
            out = localize(out, buf, per_row, p)
            for _, loc in reversed(per_row):
                out = Alloc(loc, out)
        return out

    body, groups = thread_grid(total, target.threads_per_block, body_of)
    bufs, written = global_buffers(body, list(prog.params))
    k = Kernel(prog.name, bufs, tuple(free_syms(body)), body, groups, target.threads_per_block, written)
    return Schedule((k,), (), "row")


def _whole_rows(blocks: list[Block], p: int, target) -> bool:
    """cpu: a purely elementwise/injective program gets whole innermost rows per group, not one element
    (the inner loop is contiguous, vectorised by the C compiler, and the index arithmetic of the outer
    coordinates is done once per row)."""
    if not getattr(target, "core_loops", False) or p < 2:
        return False
    last = [sym.as_expr(b.iters[p - 1].extent) for b in blocks]
    return (all(not b.reduce and len(b.iters) == p for b in blocks)
            and all(e.is_const and e.value > 1 for e in last))


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


def _tiles(blocks: list[Block], extents: list, p: int, target) -> list[tuple[int, int]]:
    """The register tile as (row dimension, rows per thread) pairs: `row_tile_m` rows of the
    second-to-last dimension unless it is 1 (prefill tokens: a dequantized weight is reused that many
    times) and `row_tile_n` of the last when they divide it (outputs: the input is loaded once for
    all of them). Only for reductions that load something the tiled dimension does not index (a
    weight, an input vector): that is what the rows of a tile share."""
    out = []
    for dim, t in ((p - 2, getattr(target, "row_tile_m", 1)), (p - 1, getattr(target, "row_tile_n", 1))):
        if dim < 0 or t <= 1:
            continue
        e = sym.as_expr(extents[dim])
        if e.is_const and (e.value == 1 or (dim == p - 1 and e.value % t)):
            continue
        if any(b.reduce and _shares(b, b.iters[dim].var) for b in blocks):
            out.append((dim, t))
    return out


def _shares(b: Block, var: sym.SymVar) -> bool:
    """Does reduction `b` load a buffer at indices that do not involve `var`?"""
    return any(not any(_mentions(i, var) for i in ld.arg[1]) for ld in loads(b.body.value))


def _mentions(i, var: sym.SymVar) -> bool:
    if not isinstance(i, V):
        return var in sym.as_expr(i).free_vars()
    if i.op == "index":
        return var in sym.as_expr(i.arg).free_vars()
    if i.op == "load" and any(_mentions(j, var) for j in i.arg[1]):
        return True
    return any(_mentions(s, var) for s in i.src)
