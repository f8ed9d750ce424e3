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

import math

from ..ir import sym, tir
from ..ir.kernel import Kernel, Schedule, free_syms, global_buffers
from ..ir.tir import Alloc, Barrier, Buffer, For, IfThenElse, Intrin, Seq, Stmt, Store, TensorProgram, V
from ..ir.tir_rewrite import Substitute
from .lowering import _factors, _product
from .matmul import Prefetch, Prefill, prefill_matmul, staged

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


# ---- 4- and 8-bit weights: products of their exact codes in bfloat16 and half -----------------------------------
# A weight that is a group's scale times a small integer (q4f16_1's codes less 8, q8f16_0's, GGUF's Q4_0, Q5_0 and
# Q8_0), its group 32 wide along K or a multiple of that: the codes are exact in bfloat16 and in half, so the tensor
# cores multiply them exactly, and one K step of 32 has one scale a column, which multiplies the step's sums in float.
# The activations x go in two parts, hi = bfloat16(x) (float's range, 8 bits) and lo = half(x - hi) (|lo| <= 2^-9
# |x|, 11 bits more), two m16n16k16 products where 3xTF32 takes three of half the K, and no split of the weights.
CODES = True  # off: these weights take the 3xTF32 tiles too (benchmarks A/B the two on a GPU)
CODES_K = 32  # K a step, and the group width the scales must be constant over
CODES_LD = CODES_K + 8  # a staged row of 16-bit elements: a multiple of 8 (16 bytes) as wmma's leading dimensions
SCALE_LD = BN + 4  # the staged scales' rows (16 of them, a column's scale repeated: an accumulator fragment's worth)
CODE_MAX = 256  # the integers bfloat16 holds exactly


def _int_range(v: V) -> tuple[float, float] | None:
    """The range of an integer-valued value (a code, its bits, its zero point), or None where it is not one."""
    bounds = {"uint8": (0, 255), "int8": (-128, 127), "uint16": (0, 65535), "int16": (-32768, 32767),
              "uint32": (0, 2 ** 32 - 1), "int32": (-2 ** 31, 2 ** 31 - 1)}
    op = v.op
    if op == "const":
        return (v.arg, v.arg) if float(v.arg).is_integer() else None
    if op == "index":
        return sym.Bounds().range_of(sym.as_expr(v.arg))
    if op == "load":
        return bounds.get(v.dtype)
    if op == "cast":
        inner = v.src[0]
        return _int_range(inner) if inner.dtype in bounds or inner.dtype.startswith("float") else None
    if op == "select":  # a table's entry (IQ4_NL's values): either branch
        a, b = _int_range(v.src[1]), _int_range(v.src[2])
        return None if a is None or b is None else (min(a[0], b[0]), max(a[1], b[1]))
    src = [_int_range(x) for x in v.src]
    if any(r is None for r in src):
        return None
    if op in ("add", "sub", "mul"):
        (a, b), (c, d) = src
        if op == "add":
            return a + c, b + d
        if op == "sub":
            return a - d, b - c
        products = [a * c, a * d, b * c, b * d]
        return min(products), max(products)
    if op == "neg":
        return -src[0][1], -src[0][0]
    if op in ("bitand", "bitor", "bitxor", "shr", "shl") and all(r[0] >= 0 for r in src):
        (a, b), (c, d) = src
        if op == "bitand":
            return 0, min(b, d)
        if op == "shr":
            return 0, b // 2 ** c
        if op == "shl":
            return 0, b * 2 ** d
        return 0, 2 ** math.ceil(math.log2(max(b, d) + 1)) - 1
    return None


def _constant_over_steps(v: V, k: sym.SymVar) -> bool:
    """Whether `v` reads the same elements at every k of an aligned step of CODES_K (a scale of groups of 32)."""
    kt, kk = sym.var("kt_"), sym.var("kk_")
    bounds = sym.Bounds().declare(kk, 0, CODES_K - 1)
    for ld in tir.loads(v):
        for e in ld.arg[1]:
            if isinstance(e, V):
                return False
            e = sym.as_expr(e)
            lo, hi = bounds.range_of(sym.substitute(e, {k: kt * CODES_K + kk}) - sym.substitute(e, {k: kt * CODES_K}))
            if not (-1 < lo and hi < 1):
                return False
    return True


def scaled_codes(p: Prefill) -> tuple[V, V] | None:
    """(scale, code) with the program's weight = scale * code: the code an integer within CODE_MAX (the product of
    the factors that are integers), the scale the rest, the same over each aligned K step of CODES_K; or None."""
    codes, scales = [], []
    for f in _factors(p.fb):
        (codes if _int_range(f) is not None else scales).append(f)
    if not codes or not all(_constant_over_steps(f, p.red.var) for f in scales):
        return None
    code = _product(codes)
    lo, hi = _int_range(code)
    if -CODE_MAX <= lo and hi <= CODE_MAX:
        return _product(scales), code
    return None


def codes_rule(prog: TensorProgram, target) -> Schedule | None:
    """A prefill matmul of 4- or 8-bit weights on the tensor cores: the same 64 x 64 tiles and warps as `rule`, a K
    step of 32 staged as x's two parts (bfloat16, half) and the codes in both types, each warp's fragments multiplied
    in m16n16k16 (hi x codes, lo x codes into one fresh fragment a step), the step's sums times the columns' scales
    (staged as 16 rows of BN, loaded as an accumulator fragment: its layout is the sums') added into the result in
    float."""
    if not CODES or not getattr(target, "tensor_cores", False) or target.kind != "cuda" or (
            target.max_threads_per_block < THREADS):
        return None
    p = prefill_matmul(prog, 16)
    if p is None or p.fa.dtype != "float32":
        return None
    found = scaled_codes(p)
    if found is None:
        return None
    scale, code = found
    n_ext, k_ext, m_total = sym.as_expr(p.col.extent), sym.as_expr(p.red.extent), p.m_total
    g, t, kt, e = (sym.SymVar(x) for x in ("g", "t", "kt", "e"))
    G, Tt, KT = (sym.as_expr(x) for x in (g, t, kt))
    groups, m0, n0 = p.tiles(BM, BN, G)
    LA, LC = CODES_LD, BN + PAD
    a_hi, a_lo = Buffer("As_hi", (BM * LA,), "bfloat16", "shared"), Buffer("As_lo", (BM * LA,), "float16", "shared")
    b_b, b_h = Buffer("Bs_b", (BN * LA,), "bfloat16", "shared"), Buffer("Bs_h", (BN * LA,), "float16", "shared")
    Ss = Buffer("Ss", (16 * SCALE_LD,), "float32", "shared")
    Cs = Buffer("Cs", (BM * LC,), "float32", "shared")
    fa_hi, fa_lo = (Buffer(x, (2,), "float32", f"wmma.matrix_a.{d}") for x, d in (("fa_hi", "bf16"), ("fa_lo", "f16")))
    fb_b, fb_h = (Buffer(x, (2,), "float32", f"wmma.matrix_b.{d}") for x, d in (("fb_b", "bf16"), ("fb_h", "f16")))
    acc, part, sc = (Buffer(x, (n,), "float32", "wmma.accumulator.k16") for x, n in (("acc", 4), ("acc_step", 4),
                                                                                     ("sc", 2)))
    run = 8  # a thread stages runs of 8 consecutive k: one word of 4-bit codes, 16 bytes of each 16-bit type
    v = Buffer("v", (run,), "float32", "local")
    c = sym.as_expr
    flat = sym.as_expr(e) * THREADS + Tt
    r, k0 = sym.floordiv(flat, CODES_K // run), KT * CODES_K + sym.mod(flat, CODES_K // run) * run
    at = r * LA + sym.mod(flat, CODES_K // run) * run

    def inside(first: sym.Expr, bound: sym.Expr, j: int) -> V:
        return tir.V("and", "bool", (tir.index(first + r).cmp("lt", tir.index(bound)),
                                     tir.index(k0 + j).cmp("lt", tir.index(k_ext))))

    def loaded(first: sym.Expr, bound: sym.Expr, value_at) -> list:
        return [IfThenElse(inside(first, bound, j), Store(v, (c(j),), value_at(first + r, k0 + j)),
                           Store(v, (c(j),), tir.const(0.0))) for j in range(run)]

    def code_at(n: sym.Expr, k: sym.Expr) -> V:
        return tir.cast("float32", Substitute(syms={p.col.var: n, p.red.var: k}, fresh=False).value(code))

    stage = Seq((
        For(e, c(BM * CODES_K // THREADS // run), Seq((  # x's two parts
            *loaded(m0, m_total, p.a_at),
            *[Store(a_hi, (at + j,), v[c(j)]) for j in range(run)],
            *[Store(a_lo, (at + j,), v[c(j)] - tir.cast("bfloat16", v[c(j)])) for j in range(run)]))),
        For(e, c(BN * CODES_K // THREADS // run), Seq((  # the codes, exact in both types
            *loaded(n0, n_ext, code_at),
            *[Store(b_b, (at + j,), v[c(j)]) for j in range(run)],
            *[Store(b_h, (at + j,), v[c(j)]) for j in range(run)]))),
    ))
    # the columns' scales at this step, each repeated down 16 rows: thread t stages column t % BN
    col = sym.mod(flat, BN)
    scale_at = Substitute(syms={p.col.var: n0 + col, p.red.var: KT * CODES_K}, fresh=False).value(scale)
    in_n = tir.index(n0 + col).cmp("lt", tir.index(n_ext))
    scale_reg = Buffer("sv", (1,), "float32", "local")  # loaded once, stored in 16 * BN / THREADS rows
    stage_scales = Seq((IfThenElse(in_n, Store(scale_reg, (c(0),), tir.cast("float32", scale_at)),
                                   Store(scale_reg, (c(0),), tir.const(0.0))),
                        For(e, c(16 * BN // THREADS), Store(Ss, (sym.floordiv(flat, BN) * SCALE_LD + col,),
                                                            scale_reg[c(0)]))))
    warp = sym.floordiv(Tt, 32)
    wm, wn = sym.floordiv(warp, 2) * 32, sym.mod(warp, 2) * 32
    ks = sym.SymVar("ks")
    KS = sym.as_expr(ks)
    products = [Intrin("wmma.load", (f, src), (c(i), (wm + 16 * i) * LA + KS * 16, c(LA)), (f,))
                for i in range(2) for f, src in ((fa_hi, a_hi), (fa_lo, a_lo))]
    products += [Intrin("wmma.load", (f, src), (c(j), (wn + 16 * j) * LA + KS * 16, c(LA)), (f,))
                 for j in range(2) for f, src in ((fb_b, b_b), (fb_h, b_h))]
    products += [Intrin("wmma.mma", (part, fa, fb), (c(2 * i + j), c(i), c(j)), (part,))
                 for i in range(2) for j in range(2) for fa, fb in ((fa_hi, fb_b), (fa_lo, fb_h))]
    step = Seq((
        stage, stage_scales, Barrier(),
        *[Intrin("wmma.fill", (part,), (c(f),), (part,)) for f in range(4)],
        For(ks, c(CODES_K // 16), Seq(tuple(products))),
        *[Intrin("wmma.load_acc", (sc, Ss), (c(j), wn + 16 * j, c(SCALE_LD)), (sc,)) for j in range(2)],
        *[Intrin("wmma.scale_add", (acc, sc, part), (c(2 * i + j), c(j), c(2 * i + j)), (acc,))
          for i in range(2) for j in range(2)],
        Barrier(),
    ))
    ce = sym.SymVar("ce")
    cflat = sym.as_expr(ce) * THREADS + Tt
    cr, cc = sym.floordiv(cflat, BN), sym.mod(cflat, BN)
    in_range = tir.V("and", "bool", (tir.index(m0 + cr).cmp("lt", tir.index(m_total)),
                                     tir.index(n0 + cc).cmp("lt", tir.index(n_ext))))
    body: Stmt = Seq((
        *[Intrin("wmma.fill", (acc,), (c(f),), (acc,)) for f in range(4)],
        For(kt, sym.floordiv(k_ext + (CODES_K - 1), CODES_K), step),
        *[Intrin("wmma.store", (Cs, acc), (c(2 * i + j), (wm + 16 * i) * LC + wn + 16 * j, c(LC)), (Cs,))
          for i in range(2) for j in range(2)],
        Barrier(),
        For(ce, c(BM * BN // THREADS), IfThenElse(in_range, p.tail(m0 + cr, n0 + cc, Cs[cr * LC + cc]))),
    ))
    for buf in (scale_reg, v, sc, part, acc, fb_h, fb_b, fa_lo, fa_hi, Cs, Ss, b_h, b_b, a_lo, a_hi):
        body = Alloc(buf, body)
    body = For(g, groups, For(t, c(THREADS), body, "thread", "local"), "thread", "group")
    bufs, written = global_buffers(body, list(prog.params))
    kern = Kernel(prog.name, bufs, tuple(free_syms(body)), body, groups, THREADS, written)
    return Schedule((kern,), (), "mma-codes")
