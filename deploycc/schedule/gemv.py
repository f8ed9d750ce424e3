"""Rule: GEMV for decode — lane groups of 32 threads, each making a few output rows, lanes over packed words.

A matmul whose rows are a single position (decode) reads each weight once, so its speed is how well the weight
bytes stream. A work-group of T threads is T / L groups of L lanes (a warp on NVIDIA), and each lane group makes
W output rows. Lane l reads the V consecutive inputs V(l + L kk) ... V(l + L kk) + V - 1: with 4-bit codes packed
eight to a 32-bit word (V = 8) that is one whole word per lane, the lanes of a group read neighbouring words (the
loads coalesce) and each word is unpacked once in registers (the V terms are written out and their indices
simplified, so the compiler sees one load). Each activation a lane loads serves the W rows: on an H100 the
activations' loads, not the weights', were what held a one-row group to 470-520 GB/s, and W = 4 took the
Llama-3.2-1B head from 282 to 118 us (1.25 TB/s; benchmarks/gpu_gemv.py chose the knobs). The lanes' partial sums
meet in a SubgroupReduce over the L lanes (CUDA: warp shuffles, no barrier; WGSL with subgroups: subgroup
shuffles; elsewhere a shared-memory tree of log2(L) barriers, ir/subgroup.py) and lane 0 applies the epilogue and
stores. Where a lane's V products share a factor (a quantized group's scale: its V inputs are in one group of 32),
the factor multiplies their sum once (FACTOR_SCALES), and a zero point subtracted from each code is taken once off
the inputs' sum (OFFSET_ONCE): in nvcc's SASS 5.50 instructions a 4-bit weight, 8.00 with both taken by each
product. dlight's decode-GEMV rule and llama.cpp's MMV kernels are the shape this follows. An RMS norm folded in
(transform/inline_prologue.py: "gemv-norm") adds one sum a lane, its inputs' squares, which crosses the lanes and
slices with the rows' and scales each row by rsqrt(sum / K + eps) before the epilogue. On CPU OpenCL (PoCL)
this layout is slower than one row per work-item (FACTS.md), so targets opt in with `workgroup_gemv`.
"""
from __future__ import annotations

from ..ir import sym, tir
from ..ir.kernel import Kernel, Schedule, allocs_of, free_syms, global_buffers
from ..ir.tir import Alloc, Barrier, Buffer, For, IfThenElse, Seq, Stmt, Store, SubgroupReduce, TensorProgram
from ..ir.tir_interp import reduction_parts
from ..ir.tir_rewrite import Substitute, map_value
from .lowering import (
    common_factor,
    localize,
    lower_block,
    matmul_with_epilogues,
    offset_out,
    split_matmul,
    split_stat_matmul,
    sum_of,
    unravel,
)

LANES = 32  # threads per lane group (its ROWS output rows): a warp on NVIDIA, half a wavefront on AMD and Adreno
VECTOR = 8  # consecutive inputs per lane and step: one 32-bit word of 4-bit codes, 16 bytes of fp16 weights
ROWS = 4  # rows per lane group: each activation a lane loads serves four rows' weights
UNROLL = 1  # steps written out per loop trip (more measured slower: benchmarks/gpu_gemv.py)
GROUP = 64  # threads per work-group at most: two lane groups, eight rows (times the K slices below)
# K split over slices of lane groups in one work-group, where the rows alone make few lane groups: Llama-3.2-1B's
# down projection (2,048 rows, 8,192 inputs) made 512 lane groups, four resident warps an H200 multiprocessor, and
# streamed its weights at 166 GB/s (2026-11-28), the gate and up (16,384 rows: 4,096 groups) at 716. Slices double
# while the lane groups stay under SPLIT_GROUPS and each slice keeps MIN_TRIPS steps; their sums meet in shared
# memory after one barrier, added in slice order.
SPLIT_GROUPS = 2048
MAX_SLICES = 8
MIN_TRIPS = 2
FACTOR_SCALES = True  # a lane's V products' common factor (a group's scale) multiplied once into their sum
OFFSET_ONCE = True  # and the codes' zero point taken once off the inputs' sum (sum x (q - 8) = sum x q - 8 sum x)


def slices(outputs: sym.Expr, trips: int, rows_per_group: int, threads: int, max_threads: int) -> int:
    """How many K slices a GEMV of `outputs` rows and `trips` steps a lane takes (work-groups of `threads` a slice,
    `max_threads` at most): 1 where the rows make lane groups enough."""
    if not outputs.is_const:
        return 1
    groups, S = -(-outputs.value // rows_per_group), 1
    while (S < MAX_SLICES and groups * S < SPLIT_GROUPS and trips >= 2 * S * MIN_TRIPS
           and 2 * S * threads <= max_threads):
        S *= 2
    return S


def slice_steps(Tt, T: int, S: int, trips: sym.Expr, KK) -> tuple:
    """(thread Tt's index within its slice, a slice's steps, the step thread Tt takes at trip KK) of `trips` steps
    over S slices of T threads (a thread's slice: Tt // T)."""
    if S == 1:
        return Tt, trips, KK
    per = sym.floordiv(trips + (S - 1), S)
    return sym.mod(Tt, T), per, sym.floordiv(Tt, T) * per + KK


def rule(prog: TensorProgram, target) -> Schedule | None:
    if not target.workgroup_gemv:
        return None
    stat = split_stat_matmul(prog)  # a norm folded in (transform/inline_prologue.py): its sum beside the rows'
    if stat is not None:
        stat, mm, epilogues, rhs, factor = stat
    else:
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
    intermediates = [b for b in allocs_of(prog.body) if stat is None or b is not stat.body.buffer]
    if not matmul_with_epilogues(mm, epilogues, intermediates):
        return None
    T = 1
    while T * 2 <= min(target.threads_per_block, GROUP):
        T *= 2
    L = min(LANES, T)
    W = ROWS  # rows per lane group: each input a lane loads serves W rows
    slots = W + (stat is not None)  # a lane's sums: its rows', then the norm's sum of squares
    R = T // L * W  # rows per work-group
    red_it = mm.reduce[0]
    k_ext = sym.as_expr(red_it.extent)
    V = VECTOR if k_ext.is_const and k_ext.value % VECTOR == 0 else 1
    unroll = min(UNROLL, -(-k_ext.value // (L * V))) if k_ext.is_const else UNROLL  # no step that never runs
    S = slices(outputs, -(-k_ext.value // (L * V * unroll)), W, T, target.max_threads_per_block) if k_ext.is_const else 1
    g, t, kk = sym.SymVar("g"), sym.SymVar("t"), sym.SymVar("kk")
    G, Tt, KK = (sym.as_expr(x) for x in (g, t, kk))
    lane = sym.mod(Tt, L)
    trips = sym.floordiv(k_ext + (L * V * unroll - 1), L * V * unroll)
    within, per, step_of = slice_steps(Tt, T, S, trips, KK)
    rows_of = [G * R + sym.floordiv(within, L) * W + w for w in range(W)]
    fixed = [{it.var: v for it, v in zip(spatial, unravel(row, [it.extent for it in spatial]))} for row in rows_of]
    firsts = [((step_of * unroll + u) * L + lane) * V for u in range(unroll)]
    acc = Buffer("acc", (slots,), "float32", "local")

    def below(k, n) -> tir.V:
        return tir.index(k).cmp("lt", tir.index(n))

    def row_sum(w, parts: list) -> tir.V | None:
        """Row w's products over a lane's V inputs, added to its sum: where they share a factor (a group's scale: its
        V inputs are in one group of 32), that factor times their sum, once, not once an input, and a zero point the
        codes share (q - 8) off the inputs' sum once (in nvcc's SASS for sm_90 the Llama-3.2-1B o projection's 4-bit
        weights took 5.81 instructions each so, 8.53 before); None where they share none (float weights)."""
        found = common_factor(parts) if FACTOR_SCALES and V > 1 else None
        if found is None:
            return None
        common, rests = found
        shifted = offset_out(rests) if OFFSET_ONCE else None
        if shifted is not None:  # the codes' products summed, the zero point taken once off the inputs' sum
            products, zero, inputs = shifted
            return acc[w] + common * (products - zero * inputs)
        return acc[w] + common * sum_of(rests)

    squares = reduction_parts(stat)[1] if stat is not None else None
    one = {it.var: sym.as_expr(0) for it in stat.spatial} if stat is not None else {}

    def stat_terms(k) -> tuple[Stmt, ...]:
        """The norm's sum of squares over the lane's inputs (the same loads as its rows' terms), one row: slot W."""
        if stat is None:
            return ()
        return (Store(acc, (sym.as_expr(W),), acc[W] + Substitute(syms={**one, stat.reduce[0].var: k},
                                                                   fresh=False).value(squares)),)
    in_row = [below(row, outputs) for row in rows_of]

    # K is a multiple of V: a lane's V inputs are all inside or all past the end; a row past the end is skipped
    def products(first) -> tuple[Stmt, ...]:
        parts = [[Substitute(syms={**fixed[w], red_it.var: first + v}, fresh=False).value(rhs) for v in range(V)]
                 for w in range(W)]
        sums = [row_sum(w, parts[w]) for w in range(W)]
        if sums[0] is not None:
            stores = [Store(acc, (sym.as_expr(w),), x) for w, x in enumerate(sums)]
            return tuple(IfThenElse(in_row[w], st) if w else st for w, st in enumerate(stores))
        return tuple(IfThenElse(in_row[w], Store(acc, (sym.as_expr(w),), acc[w] + parts[w][v])) if w
                     else Store(acc, (sym.as_expr(w),), acc[w] + parts[w][v]) for v in range(V) for w in range(W))
    step = Seq(tuple(IfThenElse(below(first, k_ext), Seq(
        products(first) + tuple(s for v in range(V) for s in stat_terms(first + v)))) for first in firsts))
    steps = [Store(acc, (sym.as_expr(w),), tir.const(0.0)) for w in range(slots)]
    steps += [IfThenElse(in_row[0], For(kk, per, step))]
    steps.append(SubgroupReduce(tuple(Store(acc, (sym.as_expr(w),), acc[w]) for w in range(slots)), "add", L))
    lead = tir.index(lane).cmp("eq", tir.index(0))
    parts = None
    if S > 1:
        parts, lead = meet_slices(steps, acc, slots, L, T // L * slots, S, T, Tt, within, lead)
    scale = None  # the norm's factor of the summed squares, rsqrt(sum / K + eps): once a row, not once an input
    if stat is not None:
        scale = map_value(factor, lambda x: acc[W] if x.op == "load" and x.arg[0] is stat.body.buffer else None)
    for w in range(W):
        sub = Substitute(syms=fixed[w], fresh=False)
        made = acc[w] if scale is None else scale * acc[w]
        result = Store(out, tuple(sub.expr(i) for i in mm.body.indices), sub.value(mm.init.value) + made)
        tail = Seq((result,) + tuple(lower_block(e, {a.var: fixed[w][b.var] for a, b in zip(e.iters, spatial)},
                                                 f"e{i}") for i, e in enumerate(epilogues)))
        if out in intermediates:
            local = Buffer(out.name, (1,), out.dtype, "local")
            tail = Alloc(local, localize(tail, out, local, len(out.shape)))
        steps.append(IfThenElse(tir.V("and", "bool", (lead, in_row[w])), tail))
    body = Alloc(acc, Seq(tuple(steps)))
    if parts is not None:
        body = Alloc(parts, body)
    groups = sym.floordiv(outputs + (R - 1), R)
    body = For(g, groups, For(t, sym.as_expr(T * S), body, "thread", "local"), "thread", "group")
    bufs, written = global_buffers(body, list(prog.params))
    k = Kernel(prog.name, bufs, tuple(free_syms(body)), body, groups, T * S, written)
    name = "gemv" if stat is None else "gemv-norm"
    return Schedule((k,), (), name if S == 1 else f"{name}-split{S}")


def meet_slices(steps: list, acc: Buffer, W: int, L: int, R: int, S: int, T: int, Tt, within, lead: tir.V):
    """After each slice's lane groups of L lanes reduced their W sums (`lead`: a group's lane 0; R rows and T threads a
    slice, `within` a thread's index in its slice): those lanes leave them in shared memory, one barrier, and slice
    0's add them in slice order into `acc`. Appends to `steps`; returns the shared buffer and the new `lead` (lane 0
    of slice 0's lane groups: they store)."""
    parts = Buffer("parts", (S * R,), "float32", "shared")
    slot = sym.floordiv(within, L) * W
    steps.append(IfThenElse(lead, Seq(tuple(Store(parts, (sym.floordiv(Tt, T) * R + slot + w,), acc[w])
                                            for w in range(W)))))
    steps.append(Barrier())
    total = [parts[slot + w] for w in range(W)]
    for s_ in range(1, S):
        total = [tir.V("add", "float32", (total[w], parts[s_ * R + slot + w])) for w in range(W)]
    first = tir.index(Tt).cmp("lt", tir.index(T))
    steps.append(IfThenElse(first, IfThenElse(lead, Seq(tuple(Store(acc, (sym.as_expr(w),), total[w])
                                                              for w in range(W))))))
    return parts, tir.V("and", "bool", (lead, first))


FEW = 8  # rows of activations a work-group of the few-row GEMV makes (llama.cpp's MMVQ takes up to 8 columns too)
# rows the few-row GEMV takes at most, FEW a work-group (the weights read once per FEW rows, mostly from L2): past
# them the prefill tiles. At 16 rows (the h100 server's step of 16 sequences) the 64 x 64 tiles made SmolLM2's
# 576-wide projections 9 work-groups and took 45-105 us each on an H200 (2026-11-28), the GEMV at one row 14-20.
MANY = 32


def few_rows(prog: TensorProgram, target, p, few: int = FEW) -> Kernel | None:
    """The GEMV for a matmul of a few rows (a batched step of a few sequences, a short prompt): laid out as the
    decode GEMV, each lane loading its V weights of W output columns once (dequantized into registers) and
    multiplying them with the V activations of each of its work-group's FEW rows, FEW x W accumulators a lane, one
    SubgroupReduce for all, K in slices where the columns are few (as the decode GEMV's: `slices`, `meet_slices`). The
    work-groups are the columns' times ceil(M / FEW) chunks of rows, so any M is made;
    dispatch.py launches it where M <= MANY, the tiles past that; with `few` rows a work-group (FEW: `_rows`; fewer:
    `_rows{few}`, for the steps of a few sequences, whose registers and products a chunk of FEW rows would waste).
    `p` is matmul.prefill_matmul's reading of the program."""
    if not target.workgroup_gemv:
        return None
    T = 1
    while T * 2 <= min(target.threads_per_block, GROUP):
        T *= 2
    L = min(LANES, T)
    W = ROWS
    R = T // L * W  # output columns per work-group
    n_ext, k_ext, m_total = sym.as_expr(p.col.extent), sym.as_expr(p.red.extent), p.m_total
    V = VECTOR if k_ext.is_const and k_ext.value % VECTOR == 0 else 1
    g, t, kk = sym.SymVar("g"), sym.SymVar("t"), sym.SymVar("kk")
    G, Tt, KK = (sym.as_expr(x) for x in (g, t, kk))
    lane = sym.mod(Tt, L)
    # K in slices where the columns make few lane groups, as the decode GEMV's (a work-group of T x S threads)
    S = slices(n_ext, -(-k_ext.value // (L * V)), W, T, target.max_threads_per_block) if k_ext.is_const else 1
    within, per, step_of = slice_steps(Tt, T, S, sym.floordiv(k_ext + (L * V - 1), L * V), KK)
    col_groups = sym.floordiv(n_ext + (R - 1), R)
    first_row = sym.floordiv(G, col_groups) * few  # the work-group's chunk of `few` rows
    cols = [sym.mod(G, col_groups) * R + sym.floordiv(within, L) * W + w for w in range(W)]
    first = (step_of * L + lane) * V
    acc = Buffer("acc", (few * W,), "float32", "local")
    wts = Buffer("wts", (W * V,), "float32", "local")

    def below(a, b) -> tir.V:
        return tir.index(a).cmp("lt", tir.index(b))

    def weights(w) -> Stmt:
        """wts[w, :] = column w's V dequantized weights (zeros past the last column, whose rows are not stored)."""
        values = [p.b_at(cols[w], first + v) for v in range(V)]
        load = Seq(tuple(Store(wts, (sym.as_expr(w * V + v),), values[v]) for v in range(V)))
        if not w:  # the whole step is inside column 0's guard
            return load
        zero = Seq(tuple(Store(wts, (sym.as_expr(w * V + v),), tir.const(0.0)) for v in range(V)))
        return IfThenElse(below(cols[w], n_ext), load, zero)

    # the rows as a loop of `few` trips (a compiler unrolls it; written out, the kernel's text was 8 times longer and
    # took software drivers, lavapipe and SwiftShader, minutes to compile in a whole package)
    rv = sym.SymVar("r")
    R_ = sym.as_expr(rv)

    # A row past the last (the last chunk's, M not a multiple of `few`) reads the last row again, unguarded, and its
    # sums are never stored: guarded, each row's loads waited behind its test, a round trip to memory a row and step in
    # nvcc's SASS for sm_90 (8 LDGs, then the row's 32 FFMAs, then the next row's); unguarded, the step's loads of
    # all `few` rows can be in flight together.
    def row_terms(r) -> Stmt:
        a = [p.a_at(sym.smin(first_row + r, m_total - 1), first + v) for v in range(V)]
        return Seq(tuple(Store(acc, (r * W + w,), acc[r * W + w] + a[v] * wts[w * V + v])
                         for v in range(V) for w in range(W)))
    step = Seq((*[weights(w) for w in range(W)], For(rv, sym.as_expr(few), row_terms(R_))))
    zi = sym.SymVar("z")
    steps: list[Stmt] = [For(zi, sym.as_expr(few * W), Store(acc, (sym.as_expr(zi),), tir.const(0.0)))]
    steps.append(IfThenElse(below(cols[0], n_ext), For(kk, per, IfThenElse(below(first, k_ext), step))))
    steps.append(SubgroupReduce(tuple(Store(acc, (sym.as_expr(i),), acc[i]) for i in range(few * W)), "add", L))
    lead = tir.index(lane).cmp("eq", tir.index(0))
    parts = None
    if S > 1:  # the slices' sums meet in shared memory: slice 0's lane 0 of each lane group stores
        parts, lead = meet_slices(steps, acc, few * W, L, T // L * few * W, S, T, Tt, within, lead)
    ro = sym.SymVar("ro")
    RO = sym.as_expr(ro)
    tails = []
    for w in range(W):
        ok = tir.V("and", "bool", (lead, below(cols[w], n_ext)))
        tails.append(IfThenElse(tir.V("and", "bool", (ok, below(first_row + RO, m_total))),
                                p.tail(first_row + RO, cols[w], acc[RO * W + w])))
    steps.append(For(ro, sym.as_expr(few), Seq(tuple(tails))))
    body: Stmt = Alloc(acc, Alloc(wts, Seq(tuple(steps))))
    if parts is not None:
        body = Alloc(parts, body)
    groups = col_groups * sym.floordiv(m_total + (few - 1), few)
    body = For(g, groups, For(t, sym.as_expr(T * S), body, "thread", "local"), "thread", "group")
    bufs, written = global_buffers(body, list(prog.params))
    name = prog.name + ("_rows" if few == FEW else f"_rows{few}")
    return Kernel(name, bufs, tuple(free_syms(body)), body, groups, T * S, written)
