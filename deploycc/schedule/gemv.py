"""Rule: GEMV for decode — one work-group per output element, the threads split the reduction.

A matmul whose rows are a single position (decode) reads each weight once; GPUs (and SIMD software
rasterisers such as lavapipe) want neighbouring threads to read neighbouring weights. So thread t
sums k = t, t + T, t + 2T, ... (coalesced loads), the partial sums meet in shared memory through a
tree reduction, and thread 0 applies the epilogue and stores. On CPU OpenCL (PoCL) this layout is
slower than one row per work-item (FACTS.md), so targets opt in with `workgroup_gemv`.
"""
from __future__ import annotations

from ..ir import sym, tir
from ..ir.kernel import Kernel, Schedule, allocs_of, free_syms, global_buffers
from ..ir.tir import Alloc, Barrier, Buffer, For, IfThenElse, Seq, Store, TensorProgram
from ..ir.tir_rewrite import Substitute
from .lowering import localize, lower_block, matmul_with_epilogues, split_matmul, unravel


def rule(prog: TensorProgram, target) -> Schedule | None:
    if not target.workgroup_gemv:
        return None
    found = split_matmul(prog)
    if found is None:
        return None
    mm, epilogues, rhs = found
    spatial = mm.spatial
    outputs = sym.as_expr(1)
    for it in spatial:
        outputs = outputs * it.extent
    rows = sym.as_expr(1)
    for it in spatial[:-1]:
        rows = rows * it.extent
    if not (rows.is_const and rows.value == 1):
        return None  # prefill: the tiled matmul or the row rule
    out = mm.body.buffer
    intermediates = allocs_of(prog.body)
    if not matmul_with_epilogues(mm, epilogues, intermediates):
        return None
    T = 1
    while T * 2 <= min(target.threads_per_block, 256):
        T *= 2
    g, t, kk = sym.SymVar("g"), sym.SymVar("t"), sym.SymVar("kk")
    G, Tt, KK = (sym.as_expr(x) for x in (g, t, kk))
    red_it = mm.reduce[0]
    k_ext = red_it.extent
    vals = unravel(G, [it.extent for it in spatial])
    fixed = {it.var: v for it, v in zip(spatial, vals)}
    k_val = KK * T + Tt
    part = Substitute(syms={**fixed, red_it.var: k_val}, fresh=False).value(rhs)
    red = Buffer("red", (T,), "float32", "shared")
    acc = Buffer("acc", (1,), "float32", "local")
    z = (sym.as_expr(0),)
    init = Substitute(syms=fixed, fresh=False).value(mm.init.value)
    steps = [Store(acc, z, tir.const(0.0)),
             For(kk, sym.floordiv(k_ext + (T - 1), T),
                 IfThenElse(tir.index(k_val).cmp("lt", tir.index(k_ext)), Store(acc, z, acc[0] + part))),
             Store(red, (Tt,), acc[0]), Barrier()]
    s = T // 2
    while s >= 1:
        steps += [IfThenElse(tir.index(Tt).cmp("lt", tir.index(s)), Store(red, (Tt,), red[Tt] + red[Tt + s])),
                  Barrier()]
        s //= 2
    result = Store(out, tuple(Substitute(syms=fixed, fresh=False).expr(i) for i in mm.body.indices), init + red[0])
    tail = Seq((result,) + tuple(lower_block(e, {a.var: fixed[b.var] for a, b in zip(e.iters, spatial)}, f"e{i}")
                                  for i, e in enumerate(epilogues)))
    if out in intermediates:
        local = Buffer(out.name, (1,), out.dtype, "local")
        tail = Alloc(local, localize(tail, out, local, len(out.shape)))
    steps.append(IfThenElse(tir.index(Tt).cmp("eq", tir.index(0)), tail))
    body = Alloc(red, Alloc(acc, Seq(tuple(steps))))
    body = For(g, outputs, For(t, sym.as_expr(T), body, "thread", "local"), "thread", "group")
    bufs, written = global_buffers(body, list(prog.params))
    k = Kernel(prog.name, bufs, tuple(free_syms(body)), body, outputs, T, written)
    return Schedule((k,), (), "gemv")
