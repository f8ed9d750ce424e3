"""Prefill attention on the tensor cores (CUDA, a float16 KV cache): FlashAttention's tiles with wmma products.

Takes what attention_tiles.py takes (causal attention over a contiguous or ring cache, more than one query), and a
batched step's rows over the page pool above attention.SPLIT_ROWS (`paged`: segments() below), where the
target has tensor cores, the cache is float16 (the presets' `kv_cache: float16`) and head_dim is a multiple of 16. A
block makes BQ = 16 R consecutive queries of one head, R rows of 16, each a warp's (two warps' past head_dim 128,
below); the keys the block's queries see go by in tiles of BK, staged in shared memory once for all its warps:

1. the block's threads stage the tile's BK rows of K and V (half, as cached; all their loads in flight together),
   then a barrier;
2. each warp multiplies its queries by the tile's keys on the tensor cores: S = Qh K^T + Ql K^T in m16n16k16 half
   products with float accumulation, where the queries were staged once as two halves, Qh = half(q) and
   Ql = half(q - Qh) (22 bits of q; llama.cpp's FlashAttention kernels take half(q) alone), the keys exact; S goes to
   the warp's 16 rows of shared memory;
3. the warp's lanes take a row each, two lanes a row (half its columns each): the scores scaled and capped as the
   program says, NEG where the query does not see the key (causal, its window, past the tile's keys), the row's new
   maximum m (the two lanes' through shared memory), alpha = exp(m_old - m), p = exp(s - m) for each key it sees (0
   for the others), stored as two halves Ph + Pl (p in [0, 1]); the row's sum l = alpha l + sum p; alpha goes to the
   row's 16 first columns of S;
4. each of the warp's D / 16 output fragments: part = Ph V + Pl V (fresh, over the tile's keys), then
   O = alpha O + part, elementwise with alpha loaded as an accumulator fragment (the same layout as O, whatever it
   is: the trick of mma.codes_rule's scales), in float, rounded to nearest (not in the tensor cores' accumulator,
   which rounds toward zero: mma.py);
5. a barrier before the next tile's staging.

At the end each warp stores its fragments through 16 x 16 floats of shared memory, and its lanes write O / l for the
queries that exist. Where the fragments' sums meet, the errors are float's: QK^T over head_dim in one fragment, PV over
a tile. Shared memory: Qh, Ql (BQ rows), K, V (BK rows), S and Ph, Pl (16 rows a warp); R and BK are the first of
(4, 32), (2, 32), (1, 32), (1, 16) that fit the target (at most CUDA's 48 KiB of static shared memory): head_dim 64
takes four rows of 16 queries, 128 two. Past 128 a warp's output fragments would spill (at 256, Gemma's: 255
registers), so there two warps take each row of 16 queries, each computing the same scores and softmax (the same
operations on the same values: the same results) and half of the output (PART).
"""
from __future__ import annotations

from ..ir import sym, tir
from ..ir.kernel import Kernel, Schedule, free_syms, global_buffers
from ..ir.tir import Alloc, Barrier, Buffer, For, IfThenElse, Intrin, Seq, Stmt, Store, TensorProgram
from ..op.attention import capped, window_and_cap
from .attention import COPY_BATCH, NEG, STATIC_SHARED
from .attention_tiles import below, over, sees
from .lowering import batched_copy

SHAPES = ((4, 32), (2, 32), (1, 32), (1, 16))  # (rows of 16 queries a block, keys a tile), the first that fits
# A warp's output fragments cover at most this much of head_dim: at 256 (Gemma's) one warp's 16 fragments (128 floats
# a thread) spilled (255 registers, 164 bytes of spill stores), so there two warps take the same 16 queries, each
# computing the (same) scores and softmax and half of the output
PART = 128


def parts(d: int) -> int:
    """The warps a row of 16 queries takes: head_dim in parts of at most PART."""
    return -(-d // PART)


def shared_bytes(rows: int, bk: int, d: int) -> int:
    """Of `rows` rows of 16 queries (each taking parts(d) warps) and a key tile of bk."""
    lq, ls, lp = d + 8, bk + 4, bk + 8
    warps = rows * parts(d)
    return (2 * 16 * rows * lq * 2 + 2 * bk * lq * 2 + warps * 16 * ls * 4 + 2 * warps * 16 * lp * 2
            + warps * 16 * 6 * 4)


def shape(target, d: int) -> tuple[int, int] | None:
    """(rows of 16 queries a block, keys a tile): the first of SHAPES that fits the target's shared memory (at most
    CUDA's 48 KiB of static shared memory) and threads."""
    budget = min(int(target.max_shared_memory), STATIC_SHARED)
    return next(((w, bk) for w, bk in SHAPES if shared_bytes(w, bk, d) <= budget
                 and 32 * w * parts(d) <= target.max_threads_per_block), None)


def takes(prog: TensorProgram, target) -> bool:
    Q, K, Vb = prog.params[:3]
    n, d = Q.shape[0], Q.shape[2]
    return (target.kind == "cuda" and bool(getattr(target, "tensor_cores", False)) and K.dtype == "float16"
            and Vb.dtype == "float16" and d.is_const and d.value % (16 * parts(d.value)) == 0
            and not (n.is_const and n.value == 1)
            and shape(target, d.value) is not None)


def schedule(prog: TensorProgram, target, keys, row, paged=None) -> Schedule | None:
    """The tensor-core form of a prefill attention program, or None where it does not apply. `keys`: the key count
    (the cache's rows, or a ring's logical count), `row`: key index -> cache row (attention.keys_of); or `paged`
    (attention.Paged): a batched step's rows over the page pool (below)."""
    if not takes(prog, target):
        return None
    Q, K, Vb = prog.params[:3]
    O = prog.params[-1]
    n, h, d = Q.shape
    D = d.value
    rows, BK = shape(target, D)
    SD = parts(D)  # warps a row of 16 queries takes, each D / SD of its output
    DW = D // SD
    W = rows * SD
    BQ, T = 16 * rows, 32 * W
    if (BQ * D) % T or (BK * D) % T:  # the stagings' trips a thread
        return None
    LQ, LS, LP = D + 8, BK + 4, BK + 8
    group = sym.floordiv(h, K.shape[1])
    scale = float(prog.attrs["scale"])
    window, cap = window_and_cap(prog.attrs)
    t = sym.as_expr(paged.t if paged else keys)
    c = sym.as_expr
    g, u, kt = sym.SymVar("g"), sym.SymVar("u"), sym.SymVar("kt")
    G, U, KT = c(g), c(u), c(kt)
    tiles_q = sym.floordiv(n + (BQ - 1), BQ)
    qt, hh = sym.floordiv(G, h), sym.mod(G, h)  # a query tile's heads are neighbours: a group's blocks share K/V in L2
    kv = sym.floordiv(hh, group)
    warp, lane = sym.floordiv(U, 32), sym.mod(U, 32)
    qw, dw = sym.floordiv(warp, SD), sym.mod(warp, SD)  # the warp's row of 16 queries, and its part of the output
    r, half = sym.mod(lane, 16), sym.floordiv(lane, 16)  # a lane's row of its warp's 16, and which half of the tile
    i0 = qt * BQ
    i = i0 + qw * 16 + r  # the lane's query
    last_q = sym.smin(i0 + (BQ - 1), n - 1)
    hi = last_q + t - n + 1  # the keys the block's queries see: lo .. hi - 1
    lo = sym.smax(0, i0 + t - n + 1 - window) if window else c(0)
    base = lo + KT * BK

    Qh, Ql = (Buffer(x, (BQ * LQ,), "float16", "shared") for x in ("Qh", "Ql"))
    Ks, Vs = (Buffer(x, (BK * LQ,), "float16", "shared") for x in ("Ks", "Vs"))
    S = Buffer("S", (W * 16 * LS,), "float32", "shared")
    Ph, Pl = (Buffer(x, (W * 16 * LP,), "float16", "shared") for x in ("Ph", "Pl"))
    Ms, Ls = (Buffer(x, (W * 16,), "float32", "shared") for x in ("Ms", "Ls"))  # each row's running max and sum
    Px, Ps = (Buffer(x, (W * 32,), "float32", "shared") for x in ("Px", "Ps"))  # its two lanes' max and sum of a tile
    qa_h, qa_l, pa_h, pa_l = (Buffer(x, (1,), "float32", "wmma.matrix_a.f16") for x in ("qa_h", "qa_l", "pa_h", "pa_l"))
    kb = Buffer("kb", (1,), "float32", "wmma.matrix_b.f16")  # K^T: column-major, K's rows as stored
    vb = Buffer("vb", (1,), "float32", "wmma.matrix_b.f16.row")  # V: row-major
    s_acc = Buffer("s_acc", (BK // 16,), "float32", "wmma.accumulator.k16")
    o_acc = Buffer("o_acc", (DW // 16,), "float32", "wmma.accumulator.k16")
    part, al = (Buffer(x, (1,), "float32", "wmma.accumulator.k16") for x in ("part", "al"))
    m_new, alpha, mx, sm, p = (Buffer(x, (1,), "float32", "local") for x in ("m_new", "alpha", "mx", "sm", "p"))
    z = (c(0),)
    row_s, row_p = warp * 16 * LS + r * LS, warp * 16 * LP + r * LP  # the lane's row of S and of P
    at = warp * 16 + r  # the lane's row of Ms, Ls
    cols = BK // 2  # a lane's columns of the tile: half * cols ..

    def stage_q(e):  # past the last query its row again (never stored); hi after lo, below: the read-back is exact
        flat = e * T + U
        rr, cc = sym.floordiv(flat, D), sym.mod(flat, D)
        return [(Qh, rr * LQ + cc, Q[sym.smin(i0 + rr, n - 1), hh, cc])], None

    def split_q(e):  # Ql = q - Qh, Qh read back as the half it was stored as
        flat = e * T + U
        rr, cc = sym.floordiv(flat, D), sym.mod(flat, D)
        return Store(Ql, (rr * LQ + cc,), Q[sym.smin(i0 + rr, n - 1), hh, cc] - Qh[rr * LQ + cc])

    # a page pool's sequences: the one whose keys are walked, its last key seen, the least and greatest of the block
    seg_b, seg_hi, seg_lo, seg_top = (Buffer(x, (1,), "int32", "local") for x in ("seg_b", "seg_hi", "seg_lo", "seg_top"))

    def stage_kv(e):  # past the block's last key its row again (no score of it is used: `sees`)
        flat = e * T + U
        rr, cc = sym.floordiv(flat, D), sym.mod(flat, D)
        if paged:  # the segment's sequence's key through its page table (past its keys: a page it names, or page 0)
            at_ = paged.page_row(seg_b[0], sym.smin(KT * BK + rr, t - 1))
            return [(Ks, rr * LQ + cc, K[at_, kv, cc]), (Vs, rr * LQ + cc, Vb[at_, kv, cc])], None
        j = row(sym.smin(base + rr, hi - 1))
        return [(Ks, rr * LQ + cc, K[j, kv, cc]), (Vs, rr * LQ + cc, Vb[j, kv, cc])], None

    def visible(jj) -> tir.V:
        """Whether the lane's query sees key jj of the tile."""
        if not paged:
            return sees(i, base + jj, hi, t, n, window)
        q = sym.smin(i, n - 1)
        ok = tir.V("and", "bool", (paged.seq[q].cmp("eq", seg_b[0]), paged.sees(q, KT * BK + jj, window)))
        return tir.V("and", "bool", (ok, below(i, n)))

    # 2. S = Qh K^T + Ql K^T, each fragment of the tile's 16-key columns fresh
    scores: list = [Intrin("wmma.fill", (s_acc,), (c(jn),), (s_acc,)) for jn in range(BK // 16)]
    for kd in range(D // 16):
        scores += [Intrin("wmma.load", (f, src), (c(0), qw * 16 * LQ + 16 * kd, c(LQ)), (f,))
                   for f, src in ((qa_h, Qh), (qa_l, Ql))]
        for jn in range(BK // 16):
            scores += [Intrin("wmma.load", (kb, Ks), (c(0), c(16 * jn * LQ + 16 * kd), c(LQ)), (kb,))]
            scores += [Intrin("wmma.mma", (s_acc, qa, kb), (c(jn), c(0), c(0)), (s_acc,)) for qa in (qa_h, qa_l)]
    scores += [Intrin("wmma.store", (S, s_acc), (c(jn), warp * 16 * LS + 16 * jn, c(LS)), (S,))
               for jn in range(BK // 16)]
    scores.append(Intrin("warp.sync", (), (), ()))

    # 3. the rows' softmax, two lanes a row
    def masked(e) -> Stmt:
        jj = half * cols + e
        value = capped(S[row_s + jj] * scale, cap)
        return Seq((IfThenElse(visible(jj), Store(S, (row_s + jj,), value),
                               Store(S, (row_s + jj,), tir.const(NEG))),
                    Store(mx, z, tir.vmax(mx[0], S[row_s + jj]))))

    def weigh(e) -> Stmt:
        jj = half * cols + e
        s = S[row_s + jj]
        return Seq((
            Store(p, z, tir.select(s.cmp("gt", tir.const(NEG)), tir.unary("exp", s - m_new[0]), tir.const(0.0))),
            Store(Ph, (row_p + jj,), p[0]),
            Store(Pl, (row_p + jj,), p[0] - Ph[row_p + jj]),
            Store(sm, z, sm[0] + p[0]),
        ))
    own = warp * 32 + r * 2  # the row's two lanes' partials
    softmax = [
        Store(mx, z, tir.const(NEG)), over("e", cols, masked), Store(Px, (own + half,), mx[0]),
        Intrin("warp.sync", (), (), ()),
        Store(m_new, z, tir.vmax(Ms[at], tir.vmax(Px[own], Px[own + 1]))),
        Store(alpha, z, tir.unary("exp", Ms[at] - m_new[0])),
        Store(sm, z, tir.const(0.0)), over("e", cols, weigh), Store(Ps, (own + half,), sm[0]),
        Intrin("warp.sync", (), (), ()),
        IfThenElse(tir.index(half).cmp("eq", tir.index(0)), Seq((
            Store(Ms, (at,), m_new[0]), Store(Ls, (at,), Ls[at] * alpha[0] + Ps[own] + Ps[own + 1])))),
        over("e", 8, lambda e: Store(S, (row_s + half * 8 + e,), alpha[0])),  # alpha in the row's first 16 columns
        Intrin("warp.sync", (), (), ()),
    ]

    # 4. O = alpha O + Ph V + Pl V
    update: list = [Intrin("wmma.load_acc", (al, S), (c(0), warp * 16 * LS, c(LS)), (al,))]
    for jd in range(DW // 16):
        update.append(Intrin("wmma.fill", (part,), (c(0),), (part,)))
        for ks in range(BK // 16):
            update += [Intrin("wmma.load", (f, src), (c(0), warp * 16 * LP + 16 * ks, c(LP)), (f,))
                       for f, src in ((pa_h, Ph), (pa_l, Pl))]
            update.append(Intrin("wmma.load", (vb, Vs), (c(0), 16 * ks * LQ + dw * DW + 16 * jd, c(LQ)), (vb,)))
            update += [Intrin("wmma.mma", (part, pa, vb), (c(0), c(0), c(0)), (part,)) for pa in (pa_h, pa_l)]
        update.append(Intrin("wmma.rescale_add", (o_acc, al, part), (c(jd), c(0), c(0)), (o_acc,)))

    # the results: a fragment at a time through the warp's 16 rows of S, its lanes dividing by the rows' sums
    ce = sym.SymVar("ce")
    el = c(ce) * 32 + lane
    er, ec = sym.floordiv(el, 16), sym.mod(el, 16)
    query = i0 + qw * 16 + er
    out: list = []
    for jd in range(DW // 16):
        out += [Intrin("wmma.store", (S, o_acc), (c(jd), warp * 16 * LS, c(LS)), (S,)),
                Intrin("warp.sync", (), (), ()),
                For(ce, c(8), IfThenElse(below(query, n), Store(O, (query, hh, dw * DW + 16 * jd + ec),
                                                                S[warp * 16 * LS + er * LS + ec] / Ls[warp * 16 + er]))),
                Intrin("warp.sync", (), (), ())]

    def segments(tile: Stmt) -> Stmt:
        """A page pool's step: the block's rows belong to sequences between the least and the greatest of their seq
        (a step's rows are its sequences' tokens in order, so one to a few consecutive ones; any order is right),
        each with keys of its own. For each sequence in that range, its keys up to the last one the block's rows of
        it see, in tiles; a row scores the other sequences' keys NEG (`visible`), which leaves its maximum, sum and
        output as they were (alpha 1, p 0). Every thread computes the same bounds, so the tiles' barriers are
        reached by the whole block or by none of it."""
        sg, rr, r2 = sym.SymVar("sg"), sym.SymVar("rr"), sym.SymVar("r2")
        q = sym.smin(i0 + c(rr), n - 1)
        sq = paged.seq[sym.smin(i0 + c(r2), n - 1)]
        sees_more = tir.V("and", "bool", (paged.seq[q].cmp("eq", seg_b[0]), paged.pos[q].cmp("ge", seg_hi[0])))
        batch = paged.pages.shape[0]
        return Seq((
            Store(seg_lo, z, paged.seq[i0]), Store(seg_top, z, paged.seq[i0]),
            For(r2, c(BQ), Seq((IfThenElse(sq.cmp("lt", seg_lo[0]), Store(seg_lo, z, sq)),
                                IfThenElse(sq.cmp("gt", seg_top[0]), Store(seg_top, z, sq))))),
            For(sg, batch, IfThenElse(tir.index(sg).cmp("le", seg_top[0] - seg_lo[0]), Seq((
                Store(seg_b, z, seg_lo[0] + tir.index(sg)),
                Store(seg_hi, z, tir.const(0, "int32")),
                For(rr, c(BQ), IfThenElse(sees_more, Store(seg_hi, z, paged.pos[q] + 1))),
                For(kt, sym.floordiv(t + (BK - 1), BK), IfThenElse(tir.index(KT * BK).cmp("lt", seg_hi[0]), tile)),
            )))),
        ))

    tile = Seq((batched_copy("kv", BK * D // T, stage_kv, min(BK * D // T, COPY_BATCH)), Barrier(),
                *scores, *softmax, *update, Barrier()))
    if paged:
        keys_loop = segments(tile)
    else:
        keys_loop = For(kt, sym.floordiv(hi - lo + (BK - 1), BK), tile)
    body: Stmt = Seq((
        *[Intrin("wmma.fill", (o_acc,), (c(jd),), (o_acc,)) for jd in range(DW // 16)],
        IfThenElse(tir.index(half).cmp("eq", tir.index(0)),
                   Seq((Store(Ms, (at,), tir.const(NEG)), Store(Ls, (at,), tir.const(0.0))))),
        batched_copy("q", BQ * D // T, stage_q, min(BQ * D // T, COPY_BATCH)),
        over("qs", BQ * D // T, split_q),
        keys_loop,
        *out,
    ))
    for buf in (m_new, alpha, mx, sm, p, part, al, o_acc, s_acc, vb, kb, pa_l, pa_h, qa_l, qa_h,
                Ps, Px, Ls, Ms, Pl, Ph, S, Vs, Ks, Ql, Qh, *((seg_b, seg_hi, seg_lo, seg_top) if paged else ())):
        body = Alloc(buf, body)
    groups = tiles_q * h
    body = For(g, groups, For(u, c(T), body, "thread", "local"), "thread", "group")
    bufs, written = global_buffers(body, list(prog.params))
    kern = Kernel(prog.name, bufs, tuple(free_syms(body)), body, groups, T, written, tensor="attention")
    return Schedule((kern,), (), "attention-mma")
