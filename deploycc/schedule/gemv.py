"""Rule: GEMV for decode — a few output rows per work-group, a row's lanes split its reduction.

A matmul whose rows are a single position (decode) reads each weight once, so its speed is how well the
weight bytes stream. A work-group of T threads takes R = T / L output rows; each row has L lanes (a warp
on NVIDIA), and lane l reads the V consecutive inputs (l + L * kk) * V ... + V - 1: with 4-bit codes packed
eight to a 32-bit word (V = 8) that is one whole word per lane and a row's lanes read neighbouring words, so
the loads coalesce and each word is unpacked once in registers (the V terms are written out, their indices
simplified, so the compiler sees one load). Four such steps are written out per trip of the loop, so each lane
has four independent loads in flight (on an H100 one load per lane and trip streamed 400-520 GB/s). The lanes' partial sums meet in a shared-memory tree of log2(L)
barriers, and lane 0 applies the epilogue and stores. Before, one work-group of 256 threads made one output,
one input each, with an eight-barrier tree (dlight's decode-GEMV rule and llama.cpp's MMV kernels are the
shape this follows). On CPU OpenCL (PoCL) this layout is slower than one row per work-item (FACTS.md), so
targets opt in with `workgroup_gemv`.
"""
from __future__ import annotations

from ..ir import sym, tir
from ..ir.kernel import Kernel, Schedule, allocs_of, free_syms, global_buffers
from ..ir.tir import Alloc, Barrier, Buffer, For, IfThenElse, Seq, Store, TensorProgram
from ..ir.tir_rewrite import Substitute
from .lowering import localize, lower_block, matmul_with_epilogues, split_matmul, unravel

LANES = 32  # threads per output row: a warp on NVIDIA, half a wavefront on AMD and Adreno
VECTOR = 8  # consecutive inputs per lane and step: one 32-bit word of 4-bit codes, 16 bytes of fp16 weights
UNROLL = 4  # steps written out per loop trip: their loads are independent, so a lane has four in flight
GROUP = 128  # threads per work-group at most: 4 rows, so a 576-row GEMV is still 144 groups


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
    while T * 2 <= min(target.threads_per_block, GROUP):
        T *= 2
    L = min(LANES, T)
    R = T // L
    red_it = mm.reduce[0]
    k_ext = sym.as_expr(red_it.extent)
    V = VECTOR if k_ext.is_const and k_ext.value % VECTOR == 0 else 1
    g, t, kk = sym.SymVar("g"), sym.SymVar("t"), sym.SymVar("kk")
    G, Tt, KK = (sym.as_expr(x) for x in (g, t, kk))
    lane, row = sym.mod(Tt, L), G * R + sym.floordiv(Tt, L)
    vals = unravel(row, [it.extent for it in spatial])
    fixed = {it.var: v for it, v in zip(spatial, vals)}
    unroll = min(UNROLL, -(-k_ext.value // (L * V))) if k_ext.is_const else UNROLL  # no step that never runs
    firsts = [((KK * unroll + u) * L + lane) * V for u in range(unroll)]
    red = Buffer("red", (T,), "float32", "shared")
    acc = Buffer("acc", (1,), "float32", "local")
    z = (sym.as_expr(0),)

    def term(k):
        part = Substitute(syms={**fixed, red_it.var: k}, fresh=False).value(rhs)
        return Store(acc, z, acc[0] + part)

    def below(k, n) -> tir.V:
        return tir.index(k).cmp("lt", tir.index(n))
    in_row = below(row, outputs)
    # K is a multiple of V: a lane's V inputs are all inside or all past the end
    step = Seq(tuple(IfThenElse(below(first, k_ext), Seq(tuple(term(first + v) for v in range(V))))
                     for first in firsts))
    trips = sym.floordiv(k_ext + (L * V * unroll - 1), L * V * unroll)
    steps = [Store(acc, z, tir.const(0.0)), IfThenElse(in_row, For(kk, trips, step)),
             Store(red, (Tt,), acc[0]), Barrier()]
    s = L // 2
    while s >= 1:
        steps += [IfThenElse(below(lane, s), Store(red, (Tt,), red[Tt] + red[Tt + s])), Barrier()]
        s //= 2
    init = Substitute(syms=fixed, fresh=False).value(mm.init.value)
    result = Store(out, tuple(Substitute(syms=fixed, fresh=False).expr(i) for i in mm.body.indices),
                   init + red[Tt])
    tail = Seq((result,) + tuple(lower_block(e, {a.var: fixed[b.var] for a, b in zip(e.iters, spatial)}, f"e{i}")
                                  for i, e in enumerate(epilogues)))
    if out in intermediates:
        local = Buffer(out.name, (1,), out.dtype, "local")
        tail = Alloc(local, localize(tail, out, local, len(out.shape)))
    steps.append(IfThenElse(tir.V("and", "bool", (tir.index(lane).cmp("eq", tir.index(0)), in_row)), tail))
    body = Alloc(red, Alloc(acc, Seq(tuple(steps))))
    groups = sym.floordiv(outputs + (R - 1), R)
    body = For(g, groups, For(t, sym.as_expr(T), body, "thread", "local"), "thread", "group")
    bufs, written = global_buffers(body, list(prog.params))
    k = Kernel(prog.name, bufs, tuple(free_syms(body)), body, groups, T, written)
    return Schedule((k,), (), "gemv")
