"""Rule (CUDA with tensor cores): prefill matmuls on the tensor cores, float-accurate (3xTF32).

Takes what the tiled matmul rule takes (matmul.py: `C[rows, col] += A(rows, k) * B(col, k)`, a dequantize inlined in
B, elementwise epilogues) when the target has tensor cores (`target.tensor_cores`: sm_80 and later). A block of 128
threads (four warps) makes a 64 x 64 output tile: per K step of 32, the threads stage A's 64 x 32 and B's 64 x 32
(each weight dequantized once, in the staging) in shared memory, coalesced along k, then each warp multiplies its
32 x 32 quarter as 2 x 2 fragments of 16 x 16 with CUDA's warp matrix API (`nvcuda::wmma`, m16n16k8), four k-steps of
8. The tile of results goes through shared memory to the threads, which add the matmul's initial value and apply the
epilogues, guarded at the edges (M, N and K need not be multiples of the tiles: staged zeros).

Accuracy: the tensor cores take tf32 (10 mantissa bits), not float. Each operand is split in two tf32 values,
x = hi + lo (hi = tf32(x), lo = tf32(x - hi): together 21 bits), and each fragment product is the three of the four
partial products that matter, lo*hi + hi*lo + hi*hi in float accumulators (CUTLASS's "3xTF32"), the two small ones
in an accumulator of their own added at the end (in one, the big accumulator's roundings came three times as often:
2.5x float's error at K = 2048). The tensor cores round each sum toward zero, not to nearest, so one accumulator over
the whole K gathers a bias of an ulp a step: on an H200 (2026-11-28) 7x a float32 sum's error at K = 2048 (1.5e-3
against 2.1e-4). So each K step's hi*hi goes to a fresh fragment, added to the running sum in float (round to
nearest), once a step: an error near float's own (a relative 2^-21 a product), so the kernels agree with the
float32 loop-level program as the SIMT kernels do, at a third of the tensor cores' tf32 rate (an H100's 495 dense
TFLOP/s: 165, against 67 on its float32 cores).

The fragments and their calls are Intrin statements (`wmma.*`, rendered by targets/cuda.py) on buffers of the
scopes "wmma.matrix_a", "wmma.matrix_b" and "wmma.accumulator"; the CUDA emulation (runtime/devices/cuda_emu.h) runs
them with the API's documented semantics.
"""
from __future__ import annotations

from ..ir import sym, tir
from ..ir.kernel import Kernel, Schedule, free_syms, global_buffers
from ..ir.tir import Alloc, Barrier, Buffer, For, IfThenElse, Intrin, Seq, Stmt, TensorProgram
from .matmul import Prefetch, prefill_matmul, staged

BM = BN = 64  # a block's output tile
BK = 32  # K staged per step
WARPS = 4  # 2 x 2 warps, each a 32 x 32 quarter: 2 x 2 fragments of 16 x 16
THREADS = 32 * WARPS
FRAG_K = 8  # wmma's tf32 shape: m16n16k8
PAD = 4  # shared rows padded (a multiple of 4 floats, as wmma's leading dimensions must be)
# The next K step's operands prefetched into registers during this step's products (matmul.Prefetch). Off: each K
# step waits for its loads (one round trip, ~1 us a barrier on an H200), but with it nvcc gives the kernel 255
# registers (149 without: the 3xTF32 fragments are most), 2 blocks an SM instead of 3, and no GPU has said which
# is faster yet; benchmarks/gpu_tiles.py times both where there is one.
PREFETCH = False


def rule(prog: TensorProgram, target) -> Schedule | None:
    if not getattr(target, "tensor_cores", False) or target.kind != "cuda" or target.max_threads_per_block < THREADS:
        return None
    p = prefill_matmul(prog, 16)
    if p is None or p.fa.dtype != "float32" or p.fb.dtype != "float32":
        return None
    n_ext, k_ext, m_total = sym.as_expr(p.col.extent), sym.as_expr(p.red.extent), p.m_total
    g, t, kt = (sym.SymVar(x) for x in ("g", "t", "kt"))
    G, Tt, KT = (sym.as_expr(x) for x in (g, t, kt))
    groups, m0, n0 = p.tiles(BM, BN, G)
    LA = BK + PAD  # leading dimension of the staged tiles
    LC = BN + PAD
    As = Buffer("As", (BM * LA,), "float32", "shared")
    Bs = Buffer("Bs", (BN * LA,), "float32", "shared")
    Cs = Buffer("Cs", (BM * LC,), "float32", "shared")
    a_hi, a_lo = (Buffer(x, (2,), "float32", "wmma.matrix_a") for x in ("a_hi", "a_lo"))
    b_hi, b_lo = (Buffer(x, (2,), "float32", "wmma.matrix_b") for x in ("b_hi", "b_lo"))
    acc = Buffer("acc", (4,), "float32", "wmma.accumulator")  # the sum of the K steps' hi x hi, added in float
    part = Buffer("acc_step", (4,), "float32", "wmma.accumulator")  # one K step's hi x hi, on the tensor cores
    small = Buffer("acc_small", (4,), "float32", "wmma.accumulator")  # lo x hi + hi x lo, added at the end

    def stage(buf: Buffer, value_at, bound: sym.Expr, first: sym.Expr) -> Stmt:  # row-major: r * LA + kk, as wmma
        return staged(buf, value_at, bound, first, k_ext, KT, Tt, THREADS, BM, BK, lambda r, kk: r * LA + kk)

    warp = sym.floordiv(Tt, 32)
    wm, wn = sym.floordiv(warp, 2) * 32, sym.mod(warp, 2) * 32
    ks = sym.SymVar("ks")
    KS = sym.as_expr(ks)
    c = sym.as_expr
    products = [Intrin("wmma.load_split", (a_hi, a_lo, As), (c(i), (wm + 16 * i) * LA + KS * FRAG_K, c(LA)), (a_hi, a_lo))
                for i in range(2)]
    products += [Intrin("wmma.load_split", (b_hi, b_lo, Bs), (c(j), (wn + 16 * j) * LA + KS * FRAG_K, c(LA)),
                        (b_hi, b_lo)) for j in range(2)]
    products += [Intrin("wmma.mma3", (part, small, a_hi, a_lo, b_hi, b_lo), (c(2 * i + j), c(i), c(j)), (part, small))
                 for i in range(2) for j in range(2)]
    fresh = [Intrin("wmma.fill", (part,), (c(f),), (part,)) for f in range(4)]
    summed = [Intrin("wmma.add", (acc, part), (c(f),), (acc,)) for f in range(4)]
    steps = sym.floordiv(k_ext + (BK - 1), BK)
    first: list = []
    registers: list = []
    if PREFETCH:  # the next step's operands into registers while this step's products run
        layout = lambda r, kk: r * LA + kk  # noqa: E731
        pa = Prefetch("pa", As, p.a_at, m_total, m0, k_ext, Tt, THREADS, BM, BK, layout)
        pb = Prefetch("pb", Bs, p.b_at, n_ext, n0, k_ext, Tt, THREADS, BN, BK, layout)
        nxt = sym.smin(KT + 1, steps - 1)  # the last step loads itself again, unused
        step = Seq((pa.store(KT), pb.store(KT), Barrier(), pa.load(nxt), pb.load(nxt), *fresh,
                    For(ks, c(BK // FRAG_K), Seq(tuple(products))), *summed, Barrier()))
        first, registers = [pa.load(c(0)), pb.load(c(0))], [pa.regs, pb.regs]
    else:
        step = Seq((stage(As, p.a_at, m_total, m0), stage(Bs, p.b_at, n_ext, n0), Barrier(), *fresh,
                    For(ks, c(BK // FRAG_K), Seq(tuple(products))), *summed, Barrier()))
    e = sym.SymVar("e")
    flat = sym.as_expr(e) * THREADS + Tt
    r, cc = sym.floordiv(flat, BN), sym.mod(flat, BN)
    tail = p.tail(m0 + r, n0 + cc, Cs[r * LC + cc])
    in_range = tir.V("and", "bool", (tir.index(m0 + r).cmp("lt", tir.index(m_total)),
                                     tir.index(n0 + cc).cmp("lt", tir.index(n_ext))))
    body: Stmt = Seq((
        *[Intrin("wmma.fill", (x,), (c(f),), (x,)) for x in (acc, small) for f in range(4)],
        *first,
        For(kt, steps, step),
        *[Intrin("wmma.add", (acc, small), (c(f),), (acc,)) for f in range(4)],
        *[Intrin("wmma.store", (Cs, acc), (c(2 * i + j), (wm + 16 * i) * LC + wn + 16 * j, c(LC)), (Cs,))
          for i in range(2) for j in range(2)],
        Barrier(),
        For(e, c(BM * BN // THREADS), IfThenElse(in_range, tail)),
    ))
    for buf in (*registers, small, part, acc, b_lo, b_hi, a_lo, a_hi, Cs, Bs, As):
        body = Alloc(buf, body)
    body = For(g, groups, For(t, c(THREADS), body, "thread", "local"), "thread", "group")
    bufs, written = global_buffers(body, list(prog.params))
    k = Kernel(prog.name, bufs, tuple(free_syms(body)), body, groups, THREADS, written)
    return Schedule((k,), (), "mma")
