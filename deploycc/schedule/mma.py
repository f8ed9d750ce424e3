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
from dataclasses import dataclass

import numpy as np

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
    if not getattr(target, "tensor_cores", False) or not getattr(target, "tf32_tiles", True) or (
            target.kind != "cuda" or target.max_threads_per_block < THREADS):
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
    k = Kernel(prog.name, bufs, tuple(free_syms(body)), body, groups, THREADS, written, tensor="tf32")
    return Schedule((k,), (), "mma")


# ---- 4- and 8-bit weights: products of their exact codes in bfloat16 and half -----------------------------------
# A weight that is a scale times a small integer, plus a minimum, the scale and the minimum constant over 32 of K
# (q4f16_1's codes less 8, q8f16_0's, q4f16_2's with a minimum; GGUF's Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, and the
# K-quants Q4_K, Q5_K, IQ4_XS, whose sub-blocks of 32 scale a super-block's scale) or over 16 (Q6_K, Q3_K): the codes
# are exact in bfloat16 and in half, so the tensor cores multiply them exactly, and each span of 32 (or 16) of K has
# one scale and one minimum a column, which multiply the span's sums in float. The activations x go in two parts,
# hi = bfloat16(x) (float's range, 8 bits) and lo = half(x - hi) (|lo| <= 2^-9 |x|, 11 bits more): two m16n16k16
# products where 3xTF32 takes three of half the K, and no split of the weights. A minimum m multiplies the span's sum
# of x, taken on the tensor cores too (x times a tile of ones): sum x (s q + m) = s sum x q + m sum x. An fp16 weight
# (q0f16) w = b + r, b = bfloat16(w) and r = w - b exact in bfloat16 (3 bits), in three products: hi b + hi r + lo w.
CODES = True  # off: these weights take the 3xTF32 tiles too (benchmarks A/B the two on a GPU)
CODES_K = 64  # K a step, where its shared memory fits (else 32): half the barriers and round trips of 32
# The next K step's operands (x, the codes, the scales) loaded into registers during this step's products, as
# matmul.Prefetch does for 3xTF32 (each step's loads' round trip hidden behind the products, for the registers they
# take: at a step of 32, 16 of x and 16 codes a thread). Off until a GPU says it pays (benchmarks/gpu_tiles.py).
CODES_PREFETCH = False
SPAN = 32  # the widest span of K a scale may cover (a group, a sub-block); or half of it
CODE_MAX = 256  # the integers bfloat16 holds exactly


def codes_layout(bk: int) -> tuple[int, int]:
    """(a staged row of x's parts and the codes: bk + 8 16-bit elements, a multiple of 8 (16 bytes) as wmma's leading
    dimensions require, the 8 against bank conflicts; a staged row of scales: BN floats, 4 more at a step of 32)."""
    return bk + 8, BN + (4 if bk <= 32 else 0)


def codes_shared(bk: int, spans: int, minimum: bool, half: bool = False, scaled: bool = True) -> int:
    """Shared bytes of the codes' tiles at a K step of bk: x's parts and the codes (16-bit, BM and BN rows; a half
    weight in three parts), the scales (unless there are none) and minimums of each span of the step (16 rows: an
    accumulator fragment's worth), a 16 x 16 tile of ones in both types for the minimums' sums, and a 16 x 16
    fragment of results a warp."""
    row, scale_row = codes_layout(bk)
    per_span = 4 * 16 * scale_row * ((1 if scaled else 0) + (1 if minimum else 0))
    return (2 * (2 * BM + (3 if half else 2) * BN) * row + spans * per_span + (2 * 2 * 256 if minimum else 0)
            + 4 * WARPS * 256)


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


def _indices(v: V) -> list:
    """Every index expression a value computes with: its loads' indices and its `index` values (a shift's amount); None
    for an index that is itself a loaded value."""
    if v.op == "index":
        return [sym.as_expr(v.arg)]
    out = []
    if v.op == "load":
        out = [None if isinstance(i, V) else sym.as_expr(i) for i in v.arg[1]]
    for x in v.src:
        out += _indices(x)
    return out


SAMPLED_K = 1024  # k a span's constancy is checked over where the symbolic check cannot tell (four super-blocks)


def _constant_over(v: V, k: sym.SymVar, width: int) -> bool:
    """Whether `v` reads the same elements at every k of an aligned span of `width` (a scale of groups of 32): proven
    on the indices where their difference from the span's first k is symbolically within (-1, 1); else (a K-quant's
    sub-block of a super-block: mods and quotients of k) evaluated for every k below SAMPLED_K, the other variables at
    0 and 5 (the indices are k's quotients and remainders by constants up to a super-block's 256 and a row's linear
    terms, periodic in k with a period that divides SAMPLED_K)."""
    kt, kk = sym.var("kt_"), sym.var("kk_")
    bounds = sym.Bounds().declare(kk, 0, width - 1)
    ks = np.arange(SAMPLED_K, dtype=np.int64)
    ops = {"floordiv": np.floor_divide, "mod": np.mod, "min": np.minimum, "max": np.maximum}
    for e in _indices(v):
        if e is None:
            return False
        lo, hi = bounds.range_of(sym.substitute(e, {k: kt * width + kk}) - sym.substitute(e, {k: kt * width}))
        if -1 < lo and hi < 1:
            continue
        for other in (0, 5):
            env = {x: other for x in e.free_vars() if x != k}
            at = np.broadcast_to(sym.evaluate(e, {**env, k: ks}, ops), ks.shape)
            if (at != np.repeat(at[::width], width)).any():
                return False
    return True


def _terms(v: V, sign: int = 1) -> list[tuple[int, V]]:
    """v as a sum of signed terms (its top-level adds and subtracts)."""
    if v.op in ("add", "sub") and v.dtype.startswith("float"):
        a, b = v.src
        return _terms(a, sign) + _terms(b, -sign if v.op == "sub" else sign)
    return [(sign, v)]


@dataclass
class Codes:
    """A weight as scale * code + minimum: code an integer within CODE_MAX that varies along K, or (`half`) a half
    value (q0f16's weights), scale and minimum (None: none) constant over each aligned span of `width` of K."""

    scale: V
    code: V
    minimum: V | None
    width: int
    half: bool = False


def _half_value(v: V) -> bool:
    """Whether v is a stored half (fp16 weights), as float."""
    return v.op == "cast" and v.src[0].op == "load" and v.src[0].dtype == "float16"


def scaled_codes(p: Prefill) -> Codes | None:
    """The program's weight as Codes (the widest span that holds), or None: one term with factors that vary within a
    span (their product the code, or a stored half alone), at most one term without (the minimum)."""
    for width in (SPAN, SPAN // 2):
        codes, minimum = None, None
        for sign, term in _terms(p.fb):
            factors = _factors(term)
            varying = [f for f in factors if not _constant_over(f, p.red.var, width)]
            fixed = [f for f in factors if _constant_over(f, p.red.var, width)]
            scale = _product(fixed) if sign > 0 else -_product(fixed)
            if not varying:
                if minimum is not None:
                    break
                minimum = scale
                continue
            half = len(varying) == 1 and _half_value(varying[0])
            span = _int_range(_product(varying)) if all(_int_range(f) is not None for f in varying) else None
            if codes is not None or not half and (span is None or not (-CODE_MAX <= span[0] and span[1] <= CODE_MAX)):
                break
            codes = (scale, _product(varying), half)
        else:
            if codes is not None:
                return Codes(codes[0], codes[1], minimum, width, codes[2])
    return None


def codes_rule(prog: TensorProgram, target) -> Schedule | None:
    """A prefill matmul of 4- or 8-bit weights on the tensor cores: the same 64 x 64 tiles and warps as `rule`, a K
    step of 64 (32 where that would not fit the target's shared memory: codes_shared) staged as x's two parts
    (bfloat16, half) and the codes in both types, each warp's fragments multiplied
    in m16n16k16 (hi x codes, lo x codes into one fresh fragment a span), each span's sums times the columns' scales
    (staged as 16 rows of BN, loaded as an accumulator fragment: its layout is the sums') added into the result in
    float, and where the weights have a minimum, the span's sums of x (x times a tile of ones) times the columns'
    minimums likewise."""
    if not CODES or not getattr(target, "tensor_cores", False) or target.kind != "cuda" or (
            target.max_threads_per_block < THREADS):
        return None
    p = prefill_matmul(prog, 16)
    if p is None or p.fa.dtype != "float32":
        return None
    w = scaled_codes(p)
    unit = w is not None and w.scale.op == "const" and w.scale.arg == 1.0  # fp16 weights: no scale to apply
    fits = [bk for bk in (CODES_K, 32) if w is not None and codes_shared(
        bk, bk // w.width, w.minimum is not None, w.half, not unit) <= target.max_shared_memory]
    if not fits:
        return None
    bk = fits[0]
    spans = bk // w.width
    n_ext, k_ext, m_total = sym.as_expr(p.col.extent), sym.as_expr(p.red.extent), p.m_total
    g, t, kt, e = (sym.SymVar(x) for x in ("g", "t", "kt", "e"))
    G, Tt, KT = (sym.as_expr(x) for x in (g, t, kt))
    groups, m0, n0 = p.tiles(BM, BN, G)
    LA, SL = codes_layout(bk)
    a_hi, a_lo = Buffer("As_hi", (BM * LA,), "bfloat16", "shared"), Buffer("As_lo", (BM * LA,), "float16", "shared")
    b_b, b_h = Buffer("Bs_b", (BN * LA,), "bfloat16", "shared"), Buffer("Bs_h", (BN * LA,), "float16", "shared")
    b_r = Buffer("Bs_r", (BN * LA,), "bfloat16", "shared")  # a half weight less its bfloat16 part (exact: 3 bits)
    Ss = Buffer("Ss", (spans * 16 * SL,), "float32", "shared")
    Ms = Buffer("Ms", (spans * 16 * SL,), "float32", "shared")
    ones_b, ones_h = Buffer("ones_b", (256,), "bfloat16", "shared"), Buffer("ones_h", (256,), "float16", "shared")
    Ws = Buffer("Ws", (WARPS * 256,), "float32", "shared")  # each warp's results, a fragment at a time
    fa_hi, fa_lo = (Buffer(x, (2,), "float32", f"wmma.matrix_a.{d}") for x, d in (("fa_hi", "bf16"), ("fa_lo", "f16")))
    fb_b, fb_h = (Buffer(x, (2,), "float32", f"wmma.matrix_b.{d}") for x, d in (("fb_b", "bf16"), ("fb_h", "f16")))
    fb_r = Buffer("fb_r", (2,), "float32", "wmma.matrix_b.bf16")
    f1_b, f1_h = (Buffer(x, (1,), "float32", f"wmma.matrix_b.{d}") for x, d in (("f1_b", "bf16"), ("f1_h", "f16")))
    acc, part, sc, xs = (Buffer(x, (n,), "float32", "wmma.accumulator.k16") for x, n in (
        ("acc", 4), ("acc_step", 4), ("sc", 2), ("xsum", 2)))
    run = 8  # a thread stages runs of 8 consecutive k: one word of 4-bit codes, 16 bytes of each 16-bit type
    runs_a, runs_b = BM * bk // THREADS // run, BN * bk // THREADS // run  # a thread's runs of x and of the codes
    c = sym.as_expr
    flat = sym.as_expr(e) * THREADS + Tt

    def site(e_: sym.Expr, kt_: sym.Expr) -> tuple[sym.Expr, sym.Expr, sym.Expr]:
        """(row, first k, staged index) of a thread's run e_ of step kt_."""
        f = e_ * THREADS + Tt
        r_, kk = sym.floordiv(f, bk // run), sym.mod(f, bk // run) * run
        return r_, kt_ * bk + kk, r_ * LA + kk

    def code_at(n: sym.Expr, k: sym.Expr) -> V:
        return tir.cast("float32", Substitute(syms={p.col.var: n, p.red.var: k}, fresh=False).value(w.code))

    def loads(regs: Buffer, base: int, e_: sym.Expr, kt_: sym.Expr, first_row, bound, value_at) -> list:
        """A run's 8 values into regs[base ..]: zero past the operand's rows or K."""
        r_, k_, _ = site(e_, kt_)
        return [IfThenElse(tir.V("and", "bool", (tir.index(first_row + r_).cmp("lt", tir.index(bound)),
                                                 tir.index(k_ + j).cmp("lt", tir.index(k_ext)))),
                           Store(regs, (c(base + j),), value_at(first_row + r_, k_ + j)),
                           Store(regs, (c(base + j),), tir.const(0.0))) for j in range(run)]

    def x_stores(regs: Buffer, base: int, e_: sym.Expr) -> list:  # x's two parts
        at = site(e_, KT)[2]
        x = [regs[c(base + j)] for j in range(run)]
        return ([Store(a_hi, (at + j,), x[j]) for j in range(run)]
                + [Store(a_lo, (at + j,), x[j] - tir.cast("bfloat16", x[j])) for j in range(run)])

    def code_stores(regs: Buffer, base: int, e_: sym.Expr) -> list:  # exact in both types (a half weight: b + r)
        at = site(e_, KT)[2]
        q = [regs[c(base + j)] for j in range(run)]
        return ([Store(b_b, (at + j,), q[j]) for j in range(run)]
                + [Store(b_r, (at + j,), q[j] - tir.cast("bfloat16", q[j])) for j in range(run) if w.half]
                + [Store(b_h, (at + j,), q[j]) for j in range(run)])

    # each span's scales (and minimums) of the step's columns, repeated down 16 rows: thread t stages column t % BN;
    # zero past N and past K (a last step's span beyond K: its group is not in the weights)
    col = sym.mod(flat, BN)
    scaling = [(buf, value, span) for buf, value in ((Ss, None if unit else w.scale), (Ms, w.minimum))
               for span in range(spans if value is not None else 0)]

    def scale_into(regs: Buffer, i: int, value: V, span: int, kt_: sym.Expr) -> Stmt:
        first_k = kt_ * bk + span * w.width
        there = tir.V("and", "bool", (tir.index(n0 + col).cmp("lt", tir.index(n_ext)),
                                      tir.index(first_k).cmp("lt", tir.index(k_ext))))
        value_at = tir.cast("float32", Substitute(syms={p.col.var: n0 + col, p.red.var: first_k},
                                                  fresh=False).value(value))
        return IfThenElse(there, Store(regs, (c(i),), value_at), Store(regs, (c(i),), tir.const(0.0)))

    def rows_of(buf: Buffer, span: int, value_reg: V) -> Stmt:
        return For(e, c(16 * BN // THREADS), Store(buf, (span * 16 * SL + sym.floordiv(flat, BN) * SL + col,),
                                                   value_reg))
    E = sym.as_expr(e)
    first: list = []
    if CODES_PREFETCH:  # loaded a step ahead into registers, stored at the step
        pa = Buffer("pa", (runs_a * run,), "float32", "local")
        pb = Buffer("pb", (runs_b * run,), "float32", "local")
        ps = Buffer("ps", (max(1, len(scaling)),), "float32", "local")
        registers = [pa, pb, ps]

        def load(kt_: sym.Expr) -> list:
            return ([s for q in range(runs_a) for s in loads(pa, q * run, c(q), kt_, m0, m_total, p.a_at)]
                    + [s for q in range(runs_b) for s in loads(pb, q * run, c(q), kt_, n0, n_ext, code_at)]
                    + [scale_into(ps, i, value, span, kt_) for i, (_, value, span) in enumerate(scaling)])
        steps = sym.floordiv(k_ext + (bk - 1), bk)
        first = load(c(0))
        stage = [*[s for q in range(runs_a) for s in x_stores(pa, q * run, c(q))],
                 *[s for q in range(runs_b) for s in code_stores(pb, q * run, c(q))],
                 *[rows_of(buf, span, ps[c(i)]) for i, (buf, _, span) in enumerate(scaling)],
                 Barrier(), *load(sym.smin(KT + 1, steps - 1))]  # the last step loads itself again, unused
    else:
        v = Buffer("v", (run,), "float32", "local")
        held = Buffer("sv", (1,), "float32", "local")  # a scale loaded once, stored in 16 * BN / THREADS rows
        registers = [held, v]
        stage = [For(e, c(runs_a), Seq((*loads(v, 0, E, KT, m0, m_total, p.a_at), *x_stores(v, 0, E)))),
                 For(e, c(runs_b), Seq((*loads(v, 0, E, KT, n0, n_ext, code_at), *code_stores(v, 0, E))))]
        for buf, value, span in scaling:
            stage += [scale_into(held, 0, value, span, KT), rows_of(buf, span, held[c(0)])]
    warp = sym.floordiv(Tt, 32)
    wm, wn = sym.floordiv(warp, 2) * 32, sym.mod(warp, 2) * 32
    # hi x codes + lo x codes; a half weight w = b + r (both exact in bfloat16): hi x b + hi x r + lo x w
    pairs = ((fa_hi, fb_b), (fa_hi, fb_r), (fa_lo, fb_h)) if w.half else ((fa_hi, fb_b), (fa_lo, fb_h))
    b_frags = ((fb_b, b_b), (fb_r, b_r), (fb_h, b_h)) if w.half else ((fb_b, b_b), (fb_h, b_h))

    def products(ks: int) -> list:  # K 16 * ks .. 16 * ks + 15: each fragment's products into part
        out = [Intrin("wmma.load", (f, src), (c(i), (wm + 16 * i) * LA + 16 * ks, c(LA)), (f,))
               for i in range(2) for f, src in ((fa_hi, a_hi), (fa_lo, a_lo))]
        out += [Intrin("wmma.load", (f, src), (c(j), (wn + 16 * j) * LA + 16 * ks, c(LA)), (f,))
                for j in range(2) for f, src in b_frags]
        out += [Intrin("wmma.mma", (part, fa, fb), (c(2 * i + j), c(i), c(j)), (part,))
                for i in range(2) for j in range(2) for fa, fb in pairs]
        if w.minimum is not None:  # the rows' sums of x: x times ones
            out += [Intrin("wmma.mma", (xs, fa, f1), (c(i), c(i), c(0)), (xs,))
                    for i in range(2) for fa, f1 in ((fa_hi, f1_b), (fa_lo, f1_h))]
        return out

    def scaled(span: int) -> list:  # acc += scale x part (+ minimum x the sums of x), the span's fragments fresh after
        if unit:  # no scale: the span's sums added in float (not left in one fragment: its roundings toward zero)
            out = [Intrin("wmma.add", (acc, part), (c(f),), (acc,)) for f in range(4)]
        else:
            out = [Intrin("wmma.load_acc", (sc, Ss), (c(j), span * 16 * SL + wn + 16 * j, c(SL)), (sc,))
                   for j in range(2)]
            out += [Intrin("wmma.scale_add", (acc, sc, part), (c(2 * i + j), c(j), c(2 * i + j)), (acc,))
                    for i in range(2) for j in range(2)]
        if w.minimum is not None:
            out += [Intrin("wmma.load_acc", (sc, Ms), (c(j), span * 16 * SL + wn + 16 * j, c(SL)), (sc,))
                    for j in range(2)]
            out += [Intrin("wmma.scale_add", (acc, sc, xs), (c(2 * i + j), c(j), c(i)), (acc,))
                    for i in range(2) for j in range(2)]
        return out + fresh

    fresh = [Intrin("wmma.fill", (part,), (c(f),), (part,)) for f in range(4)]
    if w.minimum is not None:
        fresh += [Intrin("wmma.fill", (xs,), (c(i),), (xs,)) for i in range(2)]
    body_k: list = [*stage] if CODES_PREFETCH else [*stage, Barrier()]
    for ks in range(bk // 16):
        body_k += products(ks)
        if (ks + 1) * 16 % w.width == 0:
            body_k += scaled(ks * 16 // w.width)
    body_k.append(Barrier())
    ones: list = []
    if w.minimum is not None:  # the tile of ones, once
        ones = [For(e, c(256 // THREADS), Seq((Store(ones_b, (sym.as_expr(e) * THREADS + Tt,), tir.const(1.0)),
                                               Store(ones_h, (sym.as_expr(e) * THREADS + Tt,), tir.const(1.0))))),
                Barrier(),
                Intrin("wmma.load", (f1_b, ones_b), (c(0), c(0), c(16)), (f1_b,)),
                Intrin("wmma.load", (f1_h, ones_h), (c(0), c(0), c(16)), (f1_h,))]
    # the results: each warp stores a fragment at a time in its own 16 x 16 of shared memory, and its lanes add the
    # epilogues to 8 elements each (no block barrier, and a quarter of the block's tile of shared memory)
    ce = sym.SymVar("ce")
    el = sym.as_expr(ce) * 32 + sym.mod(Tt, 32)
    out: list = []
    for i in range(2):
        for j in range(2):
            row, colv = m0 + wm + 16 * i + sym.floordiv(el, 16), n0 + wn + 16 * j + sym.mod(el, 16)
            in_range = tir.V("and", "bool", (tir.index(row).cmp("lt", tir.index(m_total)),
                                             tir.index(colv).cmp("lt", tir.index(n_ext))))
            out += [Intrin("wmma.store", (Ws, acc), (c(2 * i + j), warp * 256, c(16)), (Ws,)),
                    Intrin("warp.sync", (), (), ()),
                    For(ce, c(256 // 32), IfThenElse(in_range, p.tail(row, colv, Ws[warp * 256 + el]))),
                    Intrin("warp.sync", (), (), ())]
    body: Stmt = Seq((
        *[Intrin("wmma.fill", (acc,), (c(f),), (acc,)) for f in range(4)],
        *fresh, *ones, *first,
        For(kt, sym.floordiv(k_ext + (bk - 1), bk), Seq(tuple(body_k))),
        *out,
    ))
    extra = (xs, f1_h, f1_b, Ms, ones_h, ones_b) if w.minimum is not None else ()
    extra += (fb_r, b_r) if w.half else ()
    extra += () if unit else (Ss,)
    for buf in (*registers, sc, part, acc, fb_h, fb_b, fa_lo, fa_hi, *extra, Ws, b_h, b_b, a_lo, a_hi):
        body = Alloc(buf, body)
    body = For(g, groups, For(t, c(THREADS), body, "thread", "local"), "thread", "group")
    bufs, written = global_buffers(body, list(prog.params))
    kern = Kernel(prog.name, bufs, tuple(free_syms(body)), body, groups, THREADS, written,
                  tensor="codes3" if w.minimum is not None or w.half else "codes")  # the products a multiply-add
    return Schedule((kern,), (), "mma-codes")
