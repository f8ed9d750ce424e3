"""Rule (GPU targets): one block of threads per row for norms and softmax, a warp-level reduction per warp.

The row rule gives a whole row to one thread: at decode there is one row, so an RMS norm over 2,048 elements
ran on one thread of one block (87 us on an H100, a fifth of a 1B model's decode step). Here each row is a
block of T threads: a reduction over the row's last axis is summed by the T threads (thread u takes elements
u, u + T, ...), meets in a SubgroupReduce per warp of 32 (shuffles where the target has subgroups, ir/subgroup.py's
shared-memory tree where not), then, past one warp, the warps' results meet in shared memory after one barrier,
and every thread reads the result; an elementwise block writes elements u, u + T, ... Neighbouring threads touch
neighbouring elements, so loads coalesce.

It takes programs in the row rule's shape whose every block has exactly one axis past the rows, whose
intermediates are one value per row (a reduction's result: sum of squares, maximum, sum of exponentials) and
whose reductions are sums starting at 0 or maxima/minima. Anything else (an intermediate row of values, a
GEMV's weight reduction) is left to the other rules. Targets opt in with `workgroup_gemv`, as for the GEMV.
"""
from __future__ import annotations

from ..ir import sym, tir
from ..ir.kernel import Kernel, Schedule, free_syms, global_buffers
from ..ir.tir import Alloc, Barrier, Buffer, For, IfThenElse, Seq, Stmt, Store, SubgroupReduce, TensorProgram
from ..ir.tir_interp import reduction_parts
from ..ir.tir_rewrite import Substitute
from .lowering import localize, unravel
from .row import row_form

MIN_ROW = 32  # shorter rows stay one per thread: less than a warp of work
WARP = 32  # threads of one SubgroupReduce


def _fold(combine: str, values: list) -> tir.V:
    """The values combined pairwise (a balanced tree)."""
    while len(values) > 1:
        values = [tir.V(combine, values[0].dtype, (a, b)) for a, b in zip(values[::2], values[1::2])] + \
            (values[-1:] if len(values) % 2 else [])
    return values[0]


def rule(prog: TensorProgram, target) -> Schedule | None:
    if getattr(target, "core_loops", False) or not target.workgroup_gemv:
        return None
    found = row_form(prog)
    if found is None:
        return None
    blocks, intermediates, p = found
    if any(len(b.iters) != p + 1 for b in blocks) or not any(b.reduce for b in blocks):
        return None
    if any(len(buf.shape) != p for buf in intermediates):
        return None  # an intermediate with a value per element would need the whole row in shared memory
    inner = [sym.as_expr(b.iters[p].extent) for b in blocks]
    if not all(e.is_const for e in inner) or max(e.value for e in inner) < MIN_ROW:
        return None
    for b in blocks:
        if b.reduce:
            combine, _ = reduction_parts(b)
            init = b.init.value
            if combine not in ("add", "max", "min") or (combine == "add" and not (init.op == "const" and init.arg == 0)):
                return None
    T = 1  # a power of two: at most 256 threads, and no more than the longest row needs
    while T < max(e.value for e in inner) and T * 2 <= min(target.threads_per_block, 256):
        T *= 2
    W = min(WARP, T)  # threads that reduce together without a barrier where the target has subgroups
    g, u = sym.SymVar("g"), sym.SymVar("u")
    G, U = sym.as_expr(g), sym.as_expr(u)
    rows = sym.as_expr(1)
    for it in blocks[0].iters[:p]:
        rows = rows * it.extent
    coords = unravel(G, [it.extent for it in blocks[0].iters[:p]])
    z = (sym.as_expr(0),)
    shared: list[Buffer] = []
    steps: list[Stmt] = []
    for n, (b, extent) in enumerate(zip(blocks, inner)):
        kk = sym.SymVar("k")
        at = sym.as_expr(kk) * T + U
        fixed = {it.var: c for it, c in zip(b.iters[:p], coords)}
        sub = Substitute(syms={**fixed, b.iters[p].var: at}, fresh=False)
        trips = sym.as_expr((extent.value + T - 1) // T)
        inside = tir.index(at).cmp("lt", tir.index(extent))
        if not b.reduce:
            steps.append(For(kk, trips, IfThenElse(inside, sub.store(b.body))))
            continue
        combine, rhs = reduction_parts(b)
        store = Substitute(syms=fixed, fresh=False).store(b.body)
        acc = Buffer(f"acc{n}", (1,), store.buffer.dtype, "local")
        part = [Store(acc, z, Substitute(syms=fixed, fresh=False).value(b.init.value)),
                For(kk, trips, IfThenElse(inside, Store(acc, z, tir.V(combine, acc.dtype, (acc[0], sub.value(rhs)))))),
                SubgroupReduce((Store(acc, z, acc[0]),), combine, W)]
        if T > W:  # each warp's result to shared memory, one barrier, and every thread combines the T / W of them
            red = Buffer(f"red{n}", (T // W,), store.buffer.dtype, "shared")
            shared.append(red)
            part += [IfThenElse(tir.index(sym.mod(U, W)).cmp("eq", tir.index(0)), Store(red, (sym.floordiv(U, W),), acc[0])),
                     Barrier(), Store(acc, z, _fold(combine, [red[i] for i in range(T // W)]))]
        result = Store(store.buffer, store.indices, acc[0])
        if store.buffer in intermediates:  # every thread keeps the row's value (a local, below)
            part.append(result)
        else:
            part.append(IfThenElse(tir.index(U).cmp("eq", tir.index(0)), result))
        steps.append(Alloc(acc, Seq(tuple(part))))
    body: Stmt = Seq(tuple(steps))
    for buf in intermediates:
        local = Buffer(buf.name, (1,), buf.dtype, "local")
        body = Alloc(local, localize(body, buf, local, p))
    for buf in shared:
        body = Alloc(buf, body)
    body = For(g, rows, For(u, sym.as_expr(T), body, "thread", "local"), "thread", "group")
    bufs, written = global_buffers(body, list(prog.params))
    k = Kernel(prog.name, bufs, tuple(free_syms(body)), body, rows, T, written)
    return Schedule((k,), (), "row_block")
