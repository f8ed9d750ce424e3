"""Rule of last resort: each block its own kernel, one thread per spatial point, reductions as a
serial loop in the thread. Always correct; intermediates live in global workspace buffers."""
from __future__ import annotations

from ..ir import sym
from ..ir.kernel import Kernel, Schedule, allocs_of, free_syms, global_buffers, strip_allocs
from ..ir.tir import Block, Buffer, Seq, TensorProgram, V, loads
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
    """Several blocks over the same points, none of them a reduction, none reading or writing what another writes
    (kv.append's keys and values into the cache: vm/lower.py's pair programs)."""
    if len(stmts) < 2 or any(it.kind != "spatial" for b in stmts for it in b.iters):
        return False
    extents = [sym.as_expr(it.extent) for it in stmts[0].iters]
    if any(len(b.iters) != len(extents) or not all(sym.prove_eq(sym.as_expr(it.extent), e)
                                                    for it, e in zip(b.iters, extents)) for b in stmts[1:]):
        return False
    written = [b.body.buffer for b in stmts]
    if len(set(map(id, written))) != len(written):
        return False
    for b in stmts:
        read = loads(b.body.value) + [x for i in b.body.indices if isinstance(i, V) for x in loads(i)]
        if any(ld.arg[0] is w for ld in read for w in written):
            return False
    return True


def _one_kernel(prog: TensorProgram, stmts: list, target) -> Schedule:
    """Blocks side by side as one kernel on a GPU target: each thread makes its point of every block (one launch
    instead of one per block)."""
    first = stmts[0]
    total = sym.as_expr(1)
    for it in first.iters:
        total = total * it.extent

    def body_of(r):
        vals = unravel(r, [it.extent for it in first.iters])
        return Seq(tuple(lower_block(b, {it.var: v for it, v in zip(b.iters, vals)}, "acc") for b in stmts))

    body, groups = thread_grid(total, target.threads_per_block, body_of)
    bufs, written = global_buffers(body, list(prog.params))
    return Schedule((Kernel(prog.name, bufs, tuple(free_syms(body)), body, groups, target.threads_per_block,
                            written),), (), "fallback-side-by-side")
