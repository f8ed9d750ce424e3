"""Rule of last resort: each block its own kernel, one thread per spatial point, reductions as a
serial loop in the thread. Always correct; intermediates live in global workspace buffers."""
from __future__ import annotations

from ..ir import sym
from ..ir.kernel import Kernel, Schedule, allocs_of, free_syms, global_buffers, strip_allocs
from ..ir.tir import Block, Buffer, TensorProgram
from .lowering import lower_block, thread_grid, unravel


def rule(prog: TensorProgram, target) -> Schedule | None:
    stmts = strip_allocs(prog.body)
    if not all(isinstance(s, Block) for s in stmts):
        return None
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
