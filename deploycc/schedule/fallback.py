"""Rule of last resort: each block its own kernel, one thread per spatial point, reductions as a
serial loop in the thread. Always correct; intermediates live in global workspace buffers."""
from __future__ import annotations

from ..ir import sym, tir
from ..ir.kernel import Kernel, Schedule, allocs_of, free_syms, global_buffers, strip_allocs
from ..ir.tir import Block, Buffer, IfThenElse, Seq, TensorProgram, V, loads
from .lowering import lower_block, thread_grid, unravel


def rule(prog: TensorProgram, target) -> Schedule | None:
    stmts = strip_allocs(prog.body)
    if not all(isinstance(s, Block) for s in stmts):
        return None
    if getattr(target, "workgroup_gemv", False) and not allocs_of(prog.body) and _side_by_side(stmts):
        return _one_kernel(prog, stmts, target)
    workspace = [Buffer(b.name, b.shape, b.dtype, "global") for b in allocs_of(prog.body)]
    from ..ir.tir_rewrite import Substitute

    to_global = Substitute(dict(zip(allocs_of(prog.body), workspace)), fresh=False)
    order = list(prog.params) + workspace
    kernels = []
    for k, blk in enumerate(stmts):
        blk = to_global.stmt(blk)
        spatial = [it for it in blk.iters if it.kind == "spatial"]
        total = sym.as_expr(1)
        for it in spatial:
            total = total * it.extent

        def body_of(r, blk=blk, spatial=spatial):
            vals = unravel(r, [it.extent for it in spatial])
            return lower_block(blk, {it.var: v for it, v in zip(spatial, vals)}, "acc")

        body, groups = thread_grid(total, target.threads_per_block, body_of)
        bufs, written = global_buffers(body, order)
        name = prog.name if len(stmts) == 1 else f"{prog.name}_{k}_{blk.name}"
        kernels.append(Kernel(name, bufs, tuple(free_syms(body)), body, groups, target.threads_per_block, written))
    return Schedule(tuple(kernels), tuple(workspace), "fallback")


def _side_by_side(stmts: list) -> bool:
    """Several blocks, none of them a reduction, none reading what another writes, and two writing one buffer only
    at parts of it that cannot meet (a rope's two halves); one of them at least as many points as each other
    (vm/lower.py's kv.append programs: the keys and values into the cache, with the programs that make them)."""
    if len(stmts) < 2 or any(it.kind != "spatial" for b in stmts for it in b.iters):
        return False
    if _largest(stmts) is None:
        return False
    written = [b.body.buffer for b in stmts]
    for i, a in enumerate(stmts):
        if any(b.body.buffer is a.body.buffer and not _apart(a, b) for b in stmts[i + 1:]):
            return False
    for b in stmts:
        read = loads(b.body.value) + [x for i in b.body.indices if isinstance(i, V) for x in loads(i)]
        if any(ld.arg[0] is w for ld in read for w in written):
            return False
    return True


def _points(b: Block) -> sym.Expr:
    total = sym.as_expr(1)
    for it in b.iters:
        total = total * it.extent
    return total


def _largest(stmts: list) -> int | None:
    """The block with as many points as each other block, whatever the variables (each at least 0)."""
    totals = [_points(b) for b in stmts]
    bounds = sym.Bounds()
    return next((i for i, t in enumerate(totals) if all(bounds.prove_le(u, t) for u in totals)), None)


def _apart(a: Block, b: Block) -> bool:
    """Do two blocks store at indices that differ in some dimension for every pair of their points?"""
    def span(blk: Block, i) -> tuple[float, float] | None:
        if isinstance(i, V):
            return None
        bounds, e = sym.Bounds(), sym.as_expr(i)
        for it in blk.iters:
            if it.var in e.free_vars():
                if not sym.as_expr(it.extent).is_const:
                    return None
                bounds.declare(it.var, 0, sym.as_expr(it.extent).value - 1)
        return bounds.range_of(e)

    for i, j in zip(a.body.indices, b.body.indices):
        sa, sb = span(a, i), span(b, j)
        if sa is not None and sb is not None and (sa[1] < sb[0] or sb[1] < sa[0]):
            return True
    return False


def _one_kernel(prog: TensorProgram, stmts: list, target) -> Schedule:
    """Blocks side by side as one kernel on a GPU target: thread r makes point r of every block that has one (one
    launch instead of one per block)."""
    totals = [_points(b) for b in stmts]
    total = totals[_largest(stmts)]

    def body_of(r):
        parts = []
        for b, t in zip(stmts, totals):
            vals = unravel(r, [it.extent for it in b.iters])
            s = lower_block(b, {it.var: v for it, v in zip(b.iters, vals)}, "acc")
            parts.append(s if sym.prove_eq(t, total) else IfThenElse(tir.index(r).cmp("lt", tir.index(t)), s))
        return Seq(tuple(parts))

    body, groups = thread_grid(total, target.threads_per_block, body_of)
    bufs, written = global_buffers(body, list(prog.params))
    return Schedule((Kernel(prog.name, bufs, tuple(free_syms(body)), body, groups, target.threads_per_block,
                            written),), (), "fallback-side-by-side")
