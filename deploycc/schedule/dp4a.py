"""Rule (cuda with `dp4a`): decode's matmuls on 4/8-bit group weights as `__dp4a` integer dot products.

A decode GEMV on 4-bit float-multiplied weights (schedule/gemv.py) spends, per weight, a shift or mask, a conversion
to float, the zero point, the scale and a multiply-add: 8.0 instructions a weight in nvcc's SASS for sm_90
(benchmarks/gemv_sass.py), 1.4 times what an H100's SMs can issue while its HBM streams the weights. With the
activations rounded to 8 bits per block of 32 (the graph says so: op/linalg.py round_activations, absorbed into the
linear by transform/absorb_rounding.py) a word of eight 4-bit codes is two masks and two `__dp4a` (four byte
products summed, sm_61+): llama.cpp's MMVQ arithmetic, 3.0 instructions a weight with the rounding below.

One block of T threads (T / 32 warps, ROWS output rows a warp) in two phases:
1. The block rounds x into shared memory: 4 lanes a block of 32 inputs, 8 inputs a lane; the block's max |x| in
   a SubgroupReduce over the 4 lanes, d = max / 127, codes rint(x / d) (as round_activations_np: x * (1 / d)),
   packed four to an int32 word in the order the weight words unpack (for 4-bit codes: the even inputs of a word
   of 8, then the odd ones, which is what `w & 0x0F0F0F0F` and `(w >> 4) & 0x0F0F0F0F` hold), with d per block
   and each word's code sum. One barrier.
2. Lane l of a warp takes weight words l, l + 32, ... of its ROWS rows: per word and row two `__dp4a` (one for
   8-bit codes, their zero point 128 flipped into a signed byte by `^ 0x80808080`) and the block's scales:
   symmetric 4-bit d_w d_x (dot - 8 sum), asymmetric d_x (s dot + m sum), 8-bit d_w d_x dot. The lanes' sums meet
   in a warp shuffle reduction and lane 0 adds the epilogues and stores.

Where the rows make few warps (Llama-3.2-1B's down projection: 2,048 rows, 128 blocks of four warps), K is split over
slices of four warps as in gemv.py (`slices`): the block's S x 128 threads round x together, each slice takes its
share of the weight words, and the slices' sums meet in shared memory after a second barrier.

Every block rounds x for itself (K inputs against the block's ROWS x T / 32 rows of K weights: 0.8 of the 3.0
instructions a weight at T = 128) instead of a launch of its own: a decode step already has hundreds of launches. What the
rule takes: a program whose linear says its activations are rounded to 8 bits, one row, K a multiple of 32 whose
shared words fit (absorb_rounding asks `takes` before it absorbs), weights in one of qgemv.py's plain formats.
"""
from __future__ import annotations

from ..ir import sym, tir
from ..ir.kernel import Kernel, Schedule, allocs_of, free_syms, global_buffers, strip_allocs
from ..ir.tir import Alloc, Barrier, Block, Buffer, For, IfThenElse, Seq, Stmt, Store, SubgroupReduce, TensorProgram
from ..ir.tir_interp import reduction_parts
from ..ir.tir_rewrite import Substitute
from . import gemv, qgemv
from .lowering import localize, lower_block, unravel

BLOCK = 32  # inputs per activation scale (op/linalg.py ACTIVATION_BLOCK)
PER_LANE = 8  # inputs a lane rounds: two int32 words of codes
THREADS = 128  # four warps
ROWS = 4  # output rows a warp makes
DP4A_FORMATS = ("q4_sym", "q4_asym", "q8_sym")  # qgemv.FORMATS in their plain layout


def shared_bytes(k: int) -> int:
    """Shared memory a block takes at most: its rounded activations (K code bytes, an int sum per 8 and a float per
    32), and where K is split over slices, their sums (a float a row a slice, at most MAX_SLICES slices)."""
    return k + 4 * (k // PER_LANE) + 4 * (k // BLOCK) + 4 * gemv.MAX_SLICES * (THREADS // 32 * ROWS)


def takes(rows: int, k: int, bits: int, target) -> bool:
    """Whether the rule takes a linear of `rows` rows (1: decode) and K inputs rounded to `bits` (asked before the
    rounding is absorbed; the weight's format is the quantization's, which prepare() limits to group schemes)."""
    return (target.kind == "cuda" and target.dp4a and rows == 1 and bits == 8 and k % BLOCK == 0
            and shared_bytes(k) <= min(target.max_shared_memory, 48 * 1024))


def rule(prog: TensorProgram, target) -> Schedule | None:
    if not (target.kind == "cuda" and target.dp4a) or prog.attrs.get("activations") != 8:
        return None
    found = qgemv.product_matmul(prog)
    if found is None:
        return None
    mm, epilogues, rhs, n_it, k_it, K, N = found
    spatial = mm.spatial
    rows = sym.as_expr(1)
    for it in spatial[:-1]:
        rows = rows * it.extent
    if not (K.is_const and rows.is_const and takes(rows.value, K.value, 8, target) and N.is_const):
        return None
    found = qgemv._operands(rhs, n_it.var, k_it.var, K.value, prog, {it.var: it.extent for it in spatial[:-1]})
    if found is None:
        return None
    x_load, _, w_expr = found
    fmt = qgemv._format(w_expr, n_it.var, k_it.var, N, K.value, prog)
    if fmt is None or fmt[0] not in DP4A_FORMATS:
        return None
    return _schedule(prog, mm, epilogues, x_load, k_it.var, K.value, N.value, fmt, target.max_threads_per_block)


def _i(x) -> tir.V:
    return tir.index(x)


def _schedule(prog, mm, epilogues, x_load: tir.V, k_var, K: int, N: int, fmt, max_threads: int) -> Schedule:
    name, q, s, m = fmt
    bits = qgemv.FORMATS[name][0]
    spatial = mm.spatial
    L, W = 32, ROWS
    R = THREADS // L * W  # rows per block
    per_word = 32 // bits  # inputs a weight word holds
    n_words = K // per_word
    trips = -(-n_words // L)
    # K split over S slices of THREADS threads where the rows make few warps (gemv.slices): all S x THREADS threads
    # round x in phase 1, each slice takes its share of the weight words in phase 2, the slices' sums meet in
    # shared memory
    S = gemv.slices(sym.as_expr(N), trips, W, THREADS, max_threads)
    T = THREADS * S
    nb, words = K // BLOCK, K // PER_LANE
    g, t, j, kk = (sym.SymVar(n) for n in ("g", "t", "j", "kk"))
    G, Tt, J, KK = (sym.as_expr(v) for v in (g, t, j, kk))
    lane = sym.mod(Tt, L)
    within = sym.mod(Tt, THREADS) if S > 1 else Tt  # the thread within its slice
    zero = {it.var: sym.as_expr(0) for it in spatial[:-1]}
    x_at = lambda k: Substitute(syms={**zero, k_var: k}, fresh=False).value(x_load)  # noqa: E731

    # ---- phase 1: the block rounds x into shared words --------------------------------------------------------
    xw = Buffer("xw", (K // 4,), "int32", "shared")  # codes, four a word
    xsum = Buffer("xsum", (words,), "int32", "shared")  # each 8 inputs' code sum
    xd = Buffer("xd", (nb,), "float32", "shared")  # each block's scale
    v = Buffer("xv", (PER_LANE,), "float32", "local")
    amax = Buffer("amax", (1,), "float32", "local")
    per_trip = T // (BLOCK // PER_LANE)  # blocks rounded a trip
    blk = J * per_trip + sym.floordiv(Tt, BLOCK // PER_LANE)
    part = sym.mod(Tt, BLOCK // PER_LANE)  # which 8 of the block
    inside = _i(blk).cmp("lt", _i(nb))
    first = blk * BLOCK + part * PER_LANE
    loads = [Store(v, (sym.as_expr(e),), tir.select(inside, x_at(first + e), tir.const(0.0)))
             for e in range(PER_LANE)]
    biggest = tir.unary("abs", v[0])
    for e in range(1, PER_LANE):
        biggest = tir.vmax(biggest, tir.unary("abs", v[e]))
    scale = Buffer("scale", (2,), "float32", "local")  # d and 1 / d (0 for a block of zeros)
    d, inv = scale[0], scale[1]
    code = Buffer("code", (PER_LANE,), "int32", "local")
    codes = [code[e] for e in range(PER_LANE)]
    # a 4-bit weight word unpacks into its even inputs (low nibbles) and odd ones (high): the codes go in that order
    order = [0, 2, 4, 6, 1, 3, 5, 7] if bits == 4 else list(range(8))

    def pack(cs) -> tir.V:
        word = tir.bitwise("bitand", cs[0], 255)
        for b in range(1, 4):
            word = tir.bitwise("bitor", word, tir.bitwise("shl", tir.bitwise("bitand", cs[b], 255), 8 * b))
        return word
    total = codes[0]
    for c in codes[1:]:
        total = total + c
    rounding = Seq((
        *loads,
        Store(amax, (sym.as_expr(0),), biggest),
        SubgroupReduce((Store(amax, (sym.as_expr(0),), amax[0]),), "max", BLOCK // PER_LANE),
        Store(scale, (sym.as_expr(0),), amax[0] / tir.const(127.0)),
        Store(scale, (sym.as_expr(1),), tir.select(d.cmp("gt", tir.const(0.0)), tir.const(1.0) / d, tir.const(0.0))),
        *[Store(code, (sym.as_expr(e),), tir.cast("int32", tir.unary("rint", v[e] * inv))) for e in range(PER_LANE)],
        IfThenElse(inside, Seq((
            Store(xw, (first // 4,), pack([codes[o] for o in order[:4]])),
            Store(xw, (first // 4 + 1,), pack([codes[o] for o in order[4:]])),
            Store(xsum, (blk * (BLOCK // PER_LANE) + part,), total),
            IfThenElse(_i(part).cmp("eq", _i(0)), Store(xd, (blk,), d)))))))
    phase1 = For(j, sym.as_expr(-(-nb // per_trip)), rounding)

    # ---- phase 2: lanes over weight words, two dp4a a word ----------------------------------------------------
    acc = Buffer("acc", (W,), "float32", "local")
    row_of = [G * R + sym.floordiv(within, L) * W + w for w in range(W)]
    per = -(-trips // S)  # a slice's trips
    wi = ((sym.floordiv(Tt, THREADS) * per + KK) if S > 1 else KK) * L + lane
    wblk = sym.floordiv(wi * per_word, BLOCK)
    steps = []
    for w in range(W):
        word = q[row_of[w], wi]
        sw = s[row_of[w], wblk]
        if bits == 4:
            lo = tir.cast("int32", tir.bitwise("bitand", word, tir.const(0x0F0F0F0F, "uint32")))
            hi = tir.cast("int32", tir.bitwise("bitand", tir.bitwise("shr", word, tir.const(4, "uint32")),
                                               tir.const(0x0F0F0F0F, "uint32")))
            dot = tir.dp4a(lo, xw[2 * wi], tir.dp4a(hi, xw[2 * wi + 1], tir.const(0, "int32")))
            if m is None:  # (c - 8) s: d_w d_x (dot - 8 sum)
                term = sw * (xd[wblk] * tir.cast("float32", dot - xsum[wi] * tir.const(8, "int32")))
            else:  # c s + m
                term = xd[wblk] * (sw * tir.cast("float32", dot) + m[row_of[w], wblk] * tir.cast("float32", xsum[wi]))
        else:  # (c - 128) s: the byte c ^ 128, read as signed, is c - 128
            signed = tir.cast("int32", _xor80(word))
            dot = tir.dp4a(signed, xw[wi], tir.const(0, "int32"))
            term = sw * (xd[wblk] * tir.cast("float32", dot))
        step = Store(acc, (sym.as_expr(w),), acc[w] + term)
        steps.append(step if not w else IfThenElse(_i(row_of[w]).cmp("lt", _i(N)), step))
    loop = For(kk, sym.as_expr(per), IfThenElse(_i(wi).cmp("lt", _i(n_words)), Seq(tuple(steps))))
    phase2: list[Stmt] = [Store(acc, (sym.as_expr(w),), tir.const(0.0)) for w in range(W)]
    phase2.append(IfThenElse(_i(row_of[0]).cmp("lt", _i(N)), loop))
    phase2.append(SubgroupReduce(tuple(Store(acc, (sym.as_expr(w),), acc[w]) for w in range(W)), "add", L))
    lead = _i(lane).cmp("eq", _i(0))
    parts = None
    if S > 1:
        parts, lead = gemv.meet_slices(phase2, acc, W, L, R, S, THREADS, Tt, within, lead)
    out = mm.body.buffer
    intermediates = allocs_of(prog.body)
    for w in range(W):
        fixed = {it.var: e for it, e in zip(spatial, unravel(row_of[w], [it.extent for it in spatial]))}
        sub = Substitute(syms=fixed, fresh=False)
        result = Store(out, tuple(sub.expr(i) for i in mm.body.indices), sub.value(mm.init.value) + acc[w])
        tail: Stmt = Seq((result,) + tuple(lower_block(e, {a.var: fixed[b.var] for a, b in zip(e.iters, spatial)},
                                                       f"e{i}") for i, e in enumerate(epilogues)))
        if out in intermediates:
            local = Buffer(out.name, (1,), out.dtype, "local")
            tail = Alloc(local, localize(tail, out, local, len(out.shape)))
        ok = tir.V("and", "bool", (lead, _i(row_of[w]).cmp("lt", _i(N))))
        phase2.append(IfThenElse(ok, tail))
    body: Stmt = Alloc(v, Alloc(amax, Alloc(scale, Alloc(code, phase1))))
    body = Seq((body, Barrier(), Alloc(acc, Seq(tuple(phase2)))))
    body = Alloc(xw, Alloc(xsum, Alloc(xd, body)))
    if parts is not None:
        body = Alloc(parts, body)
    groups = sym.as_expr(-(-N // R))
    body = For(g, groups, For(t, sym.as_expr(T), body, "thread", "local"), "thread", "group")
    bufs, written = global_buffers(body, list(prog.params))
    k = Kernel(prog.name, bufs, tuple(free_syms(body)), body, groups, T, written)
    return Schedule((k,), (), f"gemv-dp4a-{name}" + (f"-split{S}" if S > 1 else ""), rounded=x_load.arg[0])


def _xor80(word: tir.V) -> tir.V:
    """word ^ 0x80808080 (each byte's top bit flipped), written with and/or: (w & 0x7F7F7F7F) | (~w & 0x80808080)."""
    low = tir.bitwise("bitand", word, tir.const(0x7F7F7F7F, "uint32"))
    top = tir.bitwise("bitand", word, tir.const(0x80808080, "uint32"))
    flipped = tir.V("sub", "uint32", (tir.const(0x80808080, "uint32"), top))  # each set top bit cleared, others set
    return tir.bitwise("bitor", low, flipped)


def rounding(prog: TensorProgram, target) -> Schedule | None:
    """Rule (GPU targets): a program that reduces each group of 32 entries and then writes each entry from its group's
    result, as round_activations' program does (op/linalg.py: each block's max |x|, then every entry rounded; what
    cuda's prefill and batched step read where the linear does not round for itself), with whatever elementwise
    producers fusion put in front. A warp per group: lane e computes entry e, the group's result meets in a
    SubgroupReduce (shuffles, no shared memory), and each lane writes its entry: one launch, loads coalesced. (The
    fallback made it two launches, the first a thread per group reading 32 entries a row apart.)"""
    if not target.workgroup_gemv:
        return None
    stmts = strip_allocs(prog.body)
    if len(stmts) != 2 or not all(isinstance(s, Block) for s in stmts):
        return None
    red, out = stmts
    if red.init is None or len(red.reduce) != 1 or len(red.spatial) != 1 or out.reduce or len(out.spatial) != 2:
        return None
    group = sym.as_expr(red.reduce[0].extent)
    if not (group.is_const and group.value == BLOCK and sym.as_expr(out.spatial[1].extent) == group):
        return None
    part = red.body.buffer
    if part not in allocs_of(prog.body) or part.scope != "local" or len(part.shape) != 1 or \
            red.body.indices != (sym.as_expr(red.spatial[0].var),):
        return None
    groups_total = sym.as_expr(red.spatial[0].extent)
    if sym.as_expr(out.spatial[0].extent) != groups_total:
        return None
    try:
        combine, value = reduction_parts(red)
    except Exception:  # noqa: BLE001 - not a combine the rule knows: the next rule's
        return None
    T = 1
    while T * 2 <= min(target.threads_per_block, 256):
        T *= 2
    if T < BLOCK:
        return None
    g, t = sym.SymVar("g"), sym.SymVar("t")
    r = sym.as_expr(g) * (T // BLOCK) + sym.floordiv(sym.as_expr(t), BLOCK)
    e = sym.mod(sym.as_expr(t), BLOCK)
    reg = Buffer(part.name, (1,), part.dtype, "local")
    inside = _i(r).cmp("lt", _i(groups_total))
    first = Substitute(syms={red.spatial[0].var: r, red.reduce[0].var: e}, fresh=False).value(value)
    write = Substitute(syms={out.spatial[0].var: r, out.spatial[1].var: e}, fresh=False)
    store = write.stmt(out.body)
    body: Stmt = Seq((
        Store(reg, (sym.as_expr(0),), tir.select(inside, first, red.init.value)),
        SubgroupReduce((Store(reg, (sym.as_expr(0),), reg[0]),), combine, BLOCK),
        IfThenElse(inside, localize(store, part, reg, 1))))
    body = Alloc(reg, body)
    n_groups = sym.floordiv(groups_total + (T // BLOCK - 1), T // BLOCK)
    body = For(g, n_groups, For(t, sym.as_expr(T), body, "thread", "local"), "thread", "group")
    bufs, written = global_buffers(body, list(prog.params))
    return Schedule((Kernel(prog.name, bufs, tuple(free_syms(body)), body, n_groups, T, written),), (), "rounding-warp")
