"""Prefill attention in tiles (GPU targets): a block makes 16 queries of one head, the keys staged in shared memory.

The split form (attention.py: _split) gives each (head, query) a block that reads every key it sees: a prefill of n
tokens reads K and V n times per head (from L2 at best). Here (FlashAttention's tiling, on the SIMT cores) a block
of T = BQ x TD threads takes BQ = 16 consecutive queries of one head: it stages their rows of Q once, then walks the
keys the tile's queries see in tiles of BK, each staged in shared memory once for the 16 queries:

1. the T threads load the tile's BK rows of K and V (coalesced along head_dim), then a barrier;
2. thread (q, p) scores keys p, p + TD, ... of query q (a dot over head_dim from shared memory; scaled and capped
   as the program says); a key query q does not see (causal, its window, past the tile's keys) scores NEG; barrier;
3. each of query q's TD threads reads the row's BK scores: the tile's maximum, one rescale exp(m_old - m_new) of
   its running sum and accumulator, then one exp per visible key, and accumulates head_dim / TD elements of the
   output (c = p, p + TD, ...) from the staged values; a barrier before the next tile overwrites them.

The TD threads of a query compute its maximum and sum alike (the same numbers in the same order), so they need no
exchange; the output is acc / sum. Shared memory: the Q rows, K and score rows padded by one float (the threads of
a step read down a column), V unpadded; BK is 32, or 16 where 32 does not fit the target (min of its shared memory
and CUDA's 48 KiB static limit), else the split form is kept. Takes causal attention over a contiguous or ring cache
(prefill, prefill_all); decode's one query (flash-decoding) and the batched step's page pool keep the split form.
"""
from __future__ import annotations

from ..ir import sym, tir
from ..ir.kernel import Kernel, Schedule, free_syms, global_buffers
from ..ir.tir import Alloc, Barrier, Buffer, For, IfThenElse, Seq, Stmt, Store, TensorProgram
from ..op.attention import capped, window_and_cap
from .attention import COPY_BATCH, NEG, STATIC_SHARED, kv_value  # NEG: a key a query does not see; kv_value: as float
from .lowering import batched_copy

BQ = 16  # queries per block
TD = 8  # threads per query: each makes head_dim / TD output elements and BK / TD scores per tile


def below(a, b) -> tir.V:
    return tir.index(a).cmp("lt", tir.index(b))


def both(a, b) -> tir.V:
    return tir.V("and", "bool", (a, b))


def over(name: str, extent, f) -> Stmt:
    """for name < extent: f(name)."""
    v = sym.SymVar(name)
    return For(v, sym.as_expr(extent), f(sym.as_expr(v)))


def sees(i, j, hi, t, n, window: int) -> tir.V:
    """Whether query i of n sees key j of a tile of the keys below hi, over a cache of t keys: causal, in its last
    `window` (0: all), and a query that exists."""
    limit = i + t - n + 1  # query i's keys end here
    ok = both(below(j, hi), below(j, limit))
    if window:
        ok = both(ok, tir.index(j).cmp("ge", tir.index(limit - window)))
    return both(ok, below(i, n))


def key_tile(target, d: int) -> int:
    """Keys per tile: 32, or 16 where 32's shared memory does not fit; 0 where neither does."""
    budget = min(int(target.max_shared_memory), STATIC_SHARED)
    for bk in (32, 16):
        floats = BQ * (d + 1) + bk * (d + 1) + bk * d + BQ * (bk + 1)
        if floats * 4 <= budget:
            return bk
    return 0


def schedule(prog: TensorProgram, target, keys, row) -> Schedule | None:
    """The tiled form of a (non-paged) attention program, or None where it does not apply. `keys`: the key count
    (the cache's rows, or a ring's logical count), `row`: key index -> cache row (attention.keys_of)."""
    Q, K, Vb = prog.params[:3]
    O = prog.params[-1]
    n, h, d = Q.shape
    D = d.value
    T = BQ * TD
    BK = key_tile(target, D)
    if (n.is_const and n.value == 1) or D % TD or not BK or target.max_threads_per_block < T or (BK * D) % T:
        return None
    group = sym.floordiv(h, K.shape[1])
    scale = float(prog.attrs["scale"])
    window, cap = window_and_cap(prog.attrs)
    t = sym.as_expr(keys)
    g, u, kt = sym.SymVar("g"), sym.SymVar("u"), sym.SymVar("kt")
    G, U, KT = (sym.as_expr(x) for x in (g, u, kt))
    tiles_q = sym.floordiv(n + (BQ - 1), BQ)
    qt, hh = sym.floordiv(G, h), sym.mod(G, h)  # a query tile's heads are neighbours: a group's blocks share K/V in L2
    kv = sym.floordiv(hh, group)
    ql, p = sym.floordiv(U, TD), sym.mod(U, TD)
    i0 = qt * BQ
    i = i0 + ql
    # the keys the tile's queries see: from the first query's first (its window) to the last query's last
    last_q = sym.smin(i0 + (BQ - 1), n - 1)
    hi = last_q + t - n + 1
    lo = sym.smax(0, i0 + t - n + 1 - window) if window else sym.as_expr(0)
    PQ, PK, PS = D + 1, D + 1, BK + 1
    Qs = Buffer("Qs", (BQ * PQ,), "float32", "shared")
    Ks = Buffer("Ks", (BK * PK,), "float32", "shared")
    Vs = Buffer("Vs", (BK * D,), "float32", "shared")
    Ss = Buffer("Ss", (BQ * PS,), "float32", "shared")
    E = D // TD  # output elements per thread
    acc = Buffer("acc", (E,), "float32", "local")
    m, l, dot, mt, corr, pw = (Buffer(x, (1,), "float32", "local") for x in ("m", "l", "dot", "mt", "corr", "pw"))
    z = (sym.as_expr(0),)

    # The stagings load unguarded, past the last query or key the tile's last row or key again (no score of such a
    # row or key is used: `sees` tests both), all of a staging's loads in flight together (lowering.batched_copy):
    # guarded, a trip at a time, each waited for its loads (schedule/attention.py's split form)
    def stage_q(e):
        flat = e * T + U
        r, c = sym.floordiv(flat, D), sym.mod(flat, D)
        return [(Qs, r * PQ + c, Q[sym.smin(i0 + r, n - 1), hh, c])], None

    base = lo + KT * BK

    def stage_kv(e):
        flat = e * T + U
        r, c = sym.floordiv(flat, D), sym.mod(flat, D)
        j = row(sym.smin(base + r, hi - 1))
        return [(Ks, r * PK + c, kv_value(K, j, kv, c)), (Vs, r * D + c, kv_value(Vb, j, kv, c))], None

    def score(e) -> Stmt:
        jj = p + TD * e
        k = sym.SymVar("k")
        return Seq((
            Store(dot, z, tir.const(0.0)),
            For(k, sym.as_expr(D), Store(dot, z, dot[0] + Qs[ql * PQ + sym.as_expr(k)] * Ks[jj * PK + sym.as_expr(k)])),
            IfThenElse(sees(i, base + jj, hi, t, n, window), Store(Ss, (ql * PS + jj,), capped(dot[0] * scale, cap)),
                       Store(Ss, (ql * PS + jj,), tir.const(NEG))),
        ))

    def weigh(jj) -> Stmt:
        s = Ss[ql * PS + jj]
        return IfThenElse(s.cmp("gt", tir.const(NEG)), Seq((
            Store(pw, z, tir.unary("exp", s - m[0])),
            Store(l, z, l[0] + pw[0]),
            over("e", E, lambda e: Store(acc, (e,), acc[e] + pw[0] * Vs[jj * D + p + TD * e])),
        )))

    update = Seq((
        Store(mt, z, m[0]),
        over("jj", BK, lambda jj: Store(mt, z, tir.vmax(mt[0], Ss[ql * PS + jj]))),
        Store(corr, z, tir.unary("exp", m[0] - mt[0])),
        Store(m, z, mt[0]),
        Store(l, z, l[0] * corr[0]),
        over("e", E, lambda e: Store(acc, (e,), acc[e] * corr[0])),
        over("jj", BK, weigh),
    ))
    tiles_k = sym.floordiv(hi - lo + (BK - 1), BK)
    body: Stmt = Seq((
        Store(m, z, tir.const(NEG)), Store(l, z, tir.const(0.0)),
        over("e", E, lambda e: Store(acc, (e,), tir.const(0.0))),
        batched_copy("q", BQ * D // T, stage_q, min(BQ * D // T, COPY_BATCH)),
        For(kt, tiles_k, Seq((
            batched_copy("kv", BK * D // T, stage_kv, min(BK * D // T, COPY_BATCH)), Barrier(),
            over("e", BK // TD, score), Barrier(),
            update, Barrier(),
        ))),
        IfThenElse(below(i, n), over("e", E, lambda e: Store(O, (i, hh, p + TD * e), acc[e] / l[0]))),
    ))
    for buf in (acc, m, l, dot, mt, corr, pw, Ss, Vs, Ks, Qs):
        body = Alloc(buf, body)
    groups = tiles_q * h
    body = For(g, groups, For(u, sym.as_expr(T), body, "thread", "local"), "thread", "group")
    bufs, written = global_buffers(body, list(prog.params))
    return Schedule((Kernel(prog.name, bufs, tuple(free_syms(body)), body, groups, T, written),), (), "attention-tiles")
