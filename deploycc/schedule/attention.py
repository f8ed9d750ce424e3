"""Rule: causal attention over the KV cache, one thread per (head, query), online softmax.

The legalized attention program materialises scores [heads, seq, total_len]; this rule never does.
Each thread streams over the keys it may see (j <= i + total_len - seq_len), keeping the running
maximum, the running sum and the output row in registers (the flash-attention recurrence), so
memory is O(head_dim) per thread for any total_len. Grouped-query heads read kv head h // group.
The score is a "lanes" reduction (vector code on OpenCL), and each key costs one exp: a key above
the running maximum rescales the sums by exp(m - s) and weighs 1, any other weighs exp(s - m).
A sliding window W starts the loop at the first key the query sees, max(0, i + total_len - seq_len + 1 - W),
so keys outside it cost nothing; a score cap c replaces a score s by c * tanh(s / c). A ring cache of R rows
(sliding-window layers keep only what their window needs) holds key j at row j % R.

A page pool (a batched step, attrs "page_size" S) holds key j of query i's sequence at row
pages[seq[i], j // S] * S + j % S and lets query i see keys up to pos[i]: the loop runs over the keys the
page table can name and skips those the query does not see (the cpu form: whole blocks of keys, BLOCK
dividing S, so a block is contiguous rows of one page; the GPU form: those keys split over blocks, flash-decoding,
for a step of up to SPLIT_ROWS queries, see _split).
"""
from __future__ import annotations

from dataclasses import replace

from ..ir import sym, tir
from ..ir.kernel import Kernel, Schedule, free_syms, global_buffers
from ..ir.tir import Alloc, Barrier, Buffer, For, IfThenElse, Intrin, Seq, Stmt, Store, TensorProgram
from ..op.attention import capped, window_and_cap
from .attention_combine import NEG, combine_partials, combine_splits, merge
from .lowering import batched_copy, reduce_lanes, thread_grid


def kv_value(buf: Buffer, *idx) -> tir.V:
    """A cached key or value as float: a float16 cache's element widened (nothing for a float32 cache)."""
    return tir.cast("float32", buf[idx])


def rule(prog: TensorProgram, target) -> Schedule | None:
    if prog.attrs.get("op") != "attention" or len(prog.params) not in (4, 7):
        return None
    Q, K, Vb = prog.params[:3]
    O = prog.params[-1]
    n, h, d = Q.shape
    t, kvh, _ = K.shape
    if not d.is_const:
        return None
    paged = Paged.of(prog)
    t, row = (paged.t, None) if paged else keys_of(prog)
    cores = getattr(target, "core_loops", False)
    if cores and (not paged or paged.size % BLOCK == 0):
        return _blocked(prog, target)
    if not cores and target.workgroup_gemv and not paged:
        from . import attention_mma, attention_tiles  # here: they read this module's constants

        mma = attention_mma.schedule(prog, target, t, row)  # prefill on the tensor cores (CUDA, a float16 cache)
        if mma is not None:
            return mma

        tiles = attention_tiles.schedule(prog, target, t, row)  # prefill: 16 queries a block (attention_tiles.py)
        if tiles is not None:
            return tiles
    if (not cores and target.workgroup_gemv and h.is_const and kvh.is_const and h.value % kvh.value == 0
            and split_threads(target, d.value, h.value // kvh.value) >= 2):
        return _split(prog, target)
    group = sym.floordiv(h, kvh)
    scale = float(prog.attrs["scale"])
    window, cap = window_and_cap(prog.attrs)

    lanes = reduce_lanes(target)

    def body_of(r):
        hh, i = sym.floordiv(r, n), sym.mod(r, n)
        kv = sym.floordiv(hh, group)
        z = (sym.as_expr(0),)
        m, l, s, corr, pr = (Buffer(x, (1,), "float32", "local") for x in ("m", "l", "s", "corr", "p"))
        acc = Buffer("acc", (d,), "float32", "local")
        j, c2, c3 = (sym.SymVar(x) for x in ("j", "c", "c"))
        if paged:
            J = paged.row(i, sym.as_expr(j))
        else:
            limit, first = visible_keys(i, t, n, window)
            J = row(sym.as_expr(j) + first)
        over_d = _over_d(d.value, lanes)
        step = key_step(lambda c: Q[i, hh, c], lambda c: kv_value(K, J, kv, c), lambda c: kv_value(Vb, J, kv, c),
                        scale, cap,
                        (m, l, s, corr, pr, acc), over_d, lanes)
        if paged:  # every key the page table names; those the query does not see are skipped
            keys = For(j, t, IfThenElse(paged.sees(i, sym.as_expr(j), window), step))
        else:  # the keys this query may see (causal, after the cached ones)
            keys = For(j, limit - first, step)
        body = Seq((
            Store(m, z, tir.const(NEG)), Store(l, z, tir.const(0.0)),
            over_d(c2, lambda e: Store(acc, (e,), tir.const(0.0))),
            keys,
            over_d(c3, lambda e: Store(O, (i, hh, e), acc[e] / l[0])),
        ))
        for buf in (m, l, s, corr, pr, acc):
            body = Alloc(buf, body)
        return body

    return _kernel(prog, target, h * n, body_of)


def _over_d(d: int, lanes: int):
    """`over_d(var, store_of)`: `for var in range(d): store_of(index)`, as a "vector" loop of `lanes` stores when it
    divides d."""
    def over_d(var, store_of) -> Stmt:
        if d % lanes:
            return For(var, sym.as_expr(d), store_of(sym.as_expr(var)))
        return For(var, sym.as_expr(d // lanes), Seq(tuple(
            store_of(sym.as_expr(var) * lanes + q) for q in range(lanes))), kind="vector")
    return over_d


def key_step(q_of, k_of, v_of, scale: float, cap: float, bufs, over_d, lanes: int) -> Stmt:
    """One key into one thread's running maximum m, sum l and accumulator acc (bufs: m, l, s, corr, p, acc); q_of(c),
    k_of(c) and v_of(c) are element c of the query, the key and the value. The score (a "lanes" loop, vector code
    where the target renders it, when lanes divides head_dim), scaled and capped; then one exp per key: a new maximum
    rescales what was summed so far, any other key is weighed."""
    m, l, s, corr, pr, acc = bufs
    d = sym.as_expr(acc.shape[0]).value
    z = (sym.as_expr(0),)
    if d % lanes == 0:
        ko = sym.SymVar("ko")
        score: Stmt = For(ko, sym.as_expr(d // lanes), Seq(tuple(
            Store(s, z, s[0] + q_of(sym.as_expr(ko) * lanes + q) * k_of(sym.as_expr(ko) * lanes + q))
            for q in range(lanes))), kind="lanes")
    else:
        k = sym.SymVar("k")
        score = For(k, sym.as_expr(d), Store(s, z, s[0] + q_of(sym.as_expr(k)) * k_of(sym.as_expr(k))))
    new_max = Seq((
        Store(corr, z, tir.unary("exp", m[0] - s[0])),
        Store(l, z, l[0] * corr[0] + 1.0),
        over_d(sym.SymVar("c"), lambda e: Store(acc, (e,), acc[e] * corr[0] + v_of(e))),
        Store(m, z, s[0]),
    ))
    weighed = Seq((
        Store(pr, z, tir.unary("exp", s[0] - m[0])),
        Store(l, z, l[0] + pr[0]),
        over_d(sym.SymVar("c"), lambda e: Store(acc, (e,), acc[e] + pr[0] * v_of(e))),
    ))
    return Seq((
        Store(s, z, tir.const(0.0)),
        score,
        Store(s, z, capped(s[0] * scale, cap)),
        IfThenElse(s[0].cmp("gt", m[0]), new_max, weighed),
    ))


class Paged:
    """The page pool of a batched step's attention program (params q, k, v, pages, seq, pos, o)."""

    def __init__(self, prog: TensorProgram):
        self.pages, self.seq, self.pos = prog.params[3:6]
        self.size = int(prog.attrs["page_size"])
        self.t = self.pages.shape[1] * self.size  # the keys a page table names

    @classmethod
    def of(cls, prog: TensorProgram) -> Paged | None:
        return cls(prog) if "page_size" in prog.attrs else None

    def row(self, i, j) -> tir.V:
        """The pool row of key j of query i's sequence."""
        return self.page_row(self.seq[i], j)

    def page_row(self, b, j) -> tir.V:
        """The pool row of key j of the step's sequence b."""
        return self.pages[b, sym.floordiv(j, self.size)] * self.size + tir.index(sym.mod(j, self.size))

    def sees(self, i, j, window: int, keys: int = 1) -> tir.V:
        """Whether query i sees key j (or any of the `keys` keys from j on): causal, and the last `window`."""
        last = self.pos[i]
        ok = tir.lift(j).cmp("le", last)
        return tir.V("and", "bool", (ok, tir.lift(j + (keys - 1)).cmp("gt", last - window))) if window else ok


def keys_of(prog: TensorProgram):
    """(the key count, key index -> cache row): a ring cache (attrs "ring") holds key j at row j % rows and
    passes the logical count as the program's symbolic parameter."""
    rows = prog.attrs.get("ring")
    if not rows:
        return prog.params[1].shape[0], lambda j: j
    return sym.as_expr(prog.sym_params[0]), lambda j: sym.mod(j, rows)


def visible_keys(i, t, n, window: int) -> tuple[sym.Expr, sym.Expr]:
    """(end, start) of the keys query i of n sees over a cache of t: causal, and the last `window` (0: all)."""
    limit = i + t - n + 1
    return limit, (sym.smax(0, limit - window) if window else sym.as_expr(0))


BLOCK = 16  # keys per block on the cpu: one 512-bit register of scores


def _blocked(prog: TensorProgram, target) -> Schedule:
    """The cpu form: keys in blocks of BLOCK, one rescale per block instead of one per key.

    Per block: the scores (each a dot over head_dim, vectorised over head_dim), the block maximum,
    one correction exp(m_old - m_new) of the sums, the BLOCK weights exp(s - m_new) as a branch-free
    loop the C compiler vectorises (dcc_expf), and the weighed values. The full blocks index keys
    affinely (contiguous rows, no gathers); the last, partial block scores its missing keys NEG
    (weight 0) and reads only the keys it has."""
    Q, K, Vb = prog.params[:3]
    O = prog.params[-1]
    n, h, d = Q.shape
    _, kvh, _ = K.shape
    paged = Paged.of(prog)
    t, row = (paged.t, None) if paged else keys_of(prog)
    group = sym.floordiv(h, kvh)
    scale = float(prog.attrs["scale"])
    window, cap = window_and_cap(prog.attrs)
    B = sym.as_expr(BLOCK)

    def body_of(r):
        hh, i = sym.floordiv(r, n), sym.mod(r, n)
        kv = sym.floordiv(hh, group)
        z = (sym.as_expr(0),)
        m, l, dot, corr, bm = (Buffer(x, (1,), "float32", "local") for x in ("m", "l", "dot", "corr", "bm"))
        s, p = Buffer("s", (B,), "float32", "local"), Buffer("p", (B,), "float32", "local")
        acc = Buffer("acc", (d,), "float32", "local")
        rb = Buffer("rb", (1,), "int32", "local")  # a paged block's first pool row

        def over(name, extent, f) -> Stmt:
            v = sym.SymVar(name)
            return For(v, sym.as_expr(extent), f(sym.as_expr(v)))

        def block(base, count, sees=None) -> Stmt:
            """Keys base .. base+count-1 (count <= BLOCK); the scores past count stay NEG. In a pool: all BLOCK
            keys, rows rb + jj, scored NEG where the query does not see them (`sees`)."""
            at = (lambda jj: rb[0] + tir.index(jj)) if paged else (lambda jj: row(base + jj))

            def score_of(jj):
                value = capped(dot[0] * scale, cap)
                return tir.select(sees(jj), value, tir.const(NEG)) if sees else value
            score = lambda jj: Seq((
                Store(dot, z, tir.const(0.0)),
                over("c", d, lambda c: Store(dot, z, dot[0] + Q[i, hh, c] * kv_value(K, at(jj), kv, c))),
                Store(s, (jj,), score_of(jj)),
            ))
            weigh = lambda jj: Seq((
                Store(l, z, l[0] + p[jj]),
                over("c", d, lambda c: Store(acc, (c,), acc[c] + p[jj] * kv_value(Vb, at(jj), kv, c))),
            ))
            return Seq((
                over("jj", count, score),
                Store(bm, z, m[0]),
                over("jj", B, lambda jj: Store(bm, z, tir.vmax(bm[0], s[jj]))),
                Store(corr, z, tir.unary("exp", m[0] - bm[0])),
                Store(l, z, l[0] * corr[0]),
                over("c", d, lambda c: Store(acc, (c,), acc[c] * corr[0])),
                Store(m, z, bm[0]),
                over("jj", B, lambda jj: Store(p, (jj,), tir.unary("exp", s[jj] - m[0]))),
                over("jj", count, weigh),
            ))

        jb = sym.SymVar("jb")
        start = (Store(m, z, tir.const(NEG)), Store(l, z, tir.const(0.0)),
                 over("c", d, lambda c: Store(acc, (c,), tir.const(0.0))))
        if paged:  # blocks of one page each; blocks the query sees no key of are skipped
            base = sym.as_expr(jb) * BLOCK
            seen = paged.sees(i, base, window, BLOCK)
            keys: Stmt = For(jb, paged.pages.shape[1] * (paged.size // BLOCK), IfThenElse(seen, Seq((
                Store(rb, z, paged.row(i, base)),
                block(base, B, lambda jj: paged.sees(i, base + jj, window)),
            ))))
        else:
            limit, first = visible_keys(i, t, n, window)
            full = sym.floordiv(limit - first, BLOCK)
            tail = first + full * BLOCK
            keys = Seq((
                For(jb, full, block(first + sym.as_expr(jb) * BLOCK, B)),
                IfThenElse(tir.index(tail).cmp("lt", tir.index(limit)), Seq((
                    over("jj", B, lambda jj: Store(s, (jj,), tir.const(NEG))),
                    block(tail, limit - tail),
                ))),
            ))
        body = Seq(start + (keys, over("c", d, lambda c: Store(O, (i, hh, c), acc[c] / l[0]))))
        for buf in (m, l, dot, corr, bm, s, p, acc) + ((rb,) if paged else ()):
            body = Alloc(buf, body)
        return body

    return _kernel(prog, target, h * n, body_of)


STATIC_SHARED = 48 * 1024  # CUDA's static __shared__ limit (more needs dynamic shared memory and an attribute)


def split_threads(target, d: int, group: int = 1, extra: int = 0) -> int:
    """Threads per query head of the split form's blocks (a block holds the `group` query heads of one kv head): a
    power of two whose block, group x that many threads up to threads_per_block, fits the target's shared memory:
    its tile of keys and values (SPLIT_KEYS_PER_THREAD keys a thread, head_dim + 1 floats a row), which its
    threads' partial accumulators then take over, and their maxima and sums; and `extra` floats more (the queries of
    a block that makes them itself: schedule/attention_append.py)."""
    budget = min(int(target.max_shared_memory), STATIC_SHARED)
    t = 1
    while group * t * 2 <= target.threads_per_block and (_shared_floats(t * 2, d, group) + extra) * 4 <= budget:
        t *= 2
    return t


def _shared_floats(t: int, d: int, group: int) -> int:
    """The split form's shared memory in floats, t threads a head: the key/value tile or the partials, whichever is
    larger (one reuses the other's memory), and the partial maxima and sums."""
    return max(2 * SPLIT_KEYS_PER_THREAD * t, group * t) * (d + 1) + 2 * group * t


def _split(prog: TensorProgram, target) -> Schedule:
    """The GPU form: a block per (kv head, query) holds the G query heads that share the kv head (grouped-query
    attention), T threads each. The keys go in tiles of 2T: the block's G x T threads load a tile's K and V rows into
    shared memory together (consecutive threads, consecutive elements: the loads coalesce, and each row is read once
    for the G heads), one barrier, then thread u of head a takes keys u and u + T of the tile, keeping its own
    online-softmax maximum, sum and accumulator in registers; a barrier before the next tile. After the last, the
    partials meet in the tile's memory: a head's output element c is its T accumulators weighed by exp(m_u - max)
    over its T sums weighed alike (flash-decoding's combine, inside one block).

    Where a step has few queries, the keys are also split over blocks (flash-decoding proper): S = ceil(keys / 2T)
    blocks a (kv head, query), block s taking the tile of keys 2Ts .. 2Ts + 2T - 1; each writes its heads' partials
    (maximum, sum, unnormalised accumulator) to a workspace, and a second kernel, one thread per output element,
    combines the S partials the same way. A 2048-key decode step of SmolLM2 on h100 (T = 32) runs 32 blocks a kv head.
    Where the target's work-groups may count their arrivals (CUDA: target.grid_arrivals) there is no second kernel:
    each block, its partials stored, counts itself in at its row's counter (a fence, then an atomic add: Intrin
    "grid.arrive"), and the block that arrives last, which then sees every other's partials, combines them for the
    row and sets the counter back to zero for the next launch (the CUDA programming guide's last-block reduction;
    one launch a layer fewer: an H200 took ~4 us a launch of a decode step, and 4.2 us a layer for the combine's).
    - a contiguous cache with one query (the decode step): always;
    - a page pool (the batched step, whose row count `seq_len` is known only at run time): dispatched by that
      count (schedule/dispatch.py's guards), the split pair up to SPLIT_ROWS rows (the sequences decoding, a short
      chunk), one block a (kv head, query) above, where the rows alone fill the GPU and a workspace of every row's
      partials would grow with the prefill chunk. A block whose keys a query does not see (past its position in
      a table as wide as the step's longest sequence) only tests them; its partial weighs nothing."""
    n = prog.params[0].shape[0]
    if Paged.of(prog) is None:
        kernels, workspace = _split_form(prog, target, n.is_const and n.value == 1)
        return Schedule(kernels, workspace, "attention-split" if workspace else "attention", zeroed=_zeroed(workspace))
    from . import attention_mma
    from .dispatch import above, at_most

    pair, workspace = _split_form(prog, target, True)
    # above SPLIT_ROWS (a prompt's chunk): the tensor cores' tiles where they take it (CUDA, a float16 pool)
    mma = attention_mma.schedule(prog, target, None, None, Paged.of(prog))
    rows = mma.kernels if mma is not None else _split_form(prog, target, False)[0]
    guarded = tuple(_guarded(k, at_most(n, SPLIT_ROWS)) for k in pair) + (_guarded(rows[0], above(n, SPLIT_ROWS)),)
    return Schedule(guarded, workspace, "attention-split|attention-mma" if mma else "attention-split|attention",
                    dispatched=True, zeroed=_zeroed(workspace))


def _zeroed(workspace: tuple[Buffer, ...]) -> tuple[Buffer, ...]:
    """The arrivals' counter among the split form's workspace: zero before the launch, left zero after it."""
    return tuple(b for b in workspace if b.name == ARRIVED)


ARRIVED = "arrived"  # the split form's counter of a (kv head, query) row's blocks that stored their partials


SPLIT_ROWS = 16  # a page pool's step splits keys over blocks up to this many queries (h100's step: 16 sequences)


def _guarded(k: Kernel, on: sym.Expr) -> Kernel:
    """k launched with zero work-groups where `on` is 0 (schedule/dispatch.py)."""
    return replace(k, groups=k.groups * on)


def _split_form(prog: TensorProgram, target, splits: bool, append=None) -> tuple[tuple[Kernel, ...], tuple[Buffer, ...]]:
    """_split's kernels and workspace: with `splits`, the keys over S blocks a (kv head, query) and the combine (for a
    page pool, its rows bounded by SPLIT_ROWS); else one block a (kv head, query). `append`: a decode step's
    attention that makes its queries and its new key and value itself (schedule/attention_append.py's Append)."""
    Q, K, Vb, O = (*prog.params[:3], prog.params[-1]) if append is None else append.buffers
    n, h, d = O.shape
    paged = Paged.of(prog)
    t, row = (paged.t, None) if paged else keys_of(prog) if append is None else (append.t, append.row)
    G = h.value // K.shape[1].value  # the query heads that share a kv head: one block's
    scale = float(prog.attrs["scale"])
    window, cap = window_and_cap(prog.attrs)
    D = d.value
    Tg = split_threads(target, D, G, 0 if append is None else G * D)  # threads a query head
    T = G * Tg
    KT = SPLIT_KEYS_PER_THREAD * Tg  # keys a tile: a split block's share
    P = D + 1  # a row of the tile (or a thread's partial accumulator), padded: the threads' rows in different banks
    g, u = sym.SymVar("g"), sym.SymVar("u")
    B, U = sym.as_expr(g), sym.as_expr(u)
    S = sym.floordiv(t + (KT - 1), KT) if splits else sym.as_expr(1)
    r = sym.floordiv(B, S) if splits else B  # the (kv head, query) row of block g
    sidx = sym.mod(B, S) if splits else sym.as_expr(0)
    kv, i = sym.floordiv(r, n), sym.mod(r, n)
    a, lane = sym.floordiv(U, Tg), sym.mod(U, Tg)  # thread u: query head a of the block's group, key lane
    hh = kv * G + a
    z = (sym.as_expr(0),)
    m, l, sc, corr, pr, mx, tot, out = (Buffer(x, (1,), "float32", "local")
                                        for x in ("m", "l", "s", "corr", "p", "mx", "tot", "o"))
    acc = Buffer("acc", (D,), "float32", "local")
    sm_m, sm_l = Buffer("sm_m", (T,), "float32", "shared"), Buffer("sm_l", (T,), "float32", "shared")
    sm = Buffer("sm_kv", (_shared_floats(Tg, D, G) - 2 * T,), "float32", "shared")  # keys, values; then partials
    sm_q = Buffer("sm_q", (G * D,), "float32", "shared")  # an appending block's queries (append.prologue)
    q_of = (lambda e: Q[i, hh, e]) if append is None else (lambda e: sm_q[a * D + e])  # noqa: E731

    def over(name, extent, f) -> Stmt:
        v = sym.SymVar(name)
        return For(v, sym.as_expr(extent), f(sym.as_expr(v)))

    lanes = reduce_lanes(target)
    over_d = _over_d(D, lanes)
    if paged:  # every key the page table names; those the query does not see are skipped
        count = t
        sees = lambda j: paged.sees(i, j, window)  # noqa: E731
        row_of = lambda j: paged.row(i, j)  # noqa: E731
        last = t - 1  # the last key a load may name: a table's entries past a sequence's pages are page 0
    else:
        limit, first = visible_keys(i, t, n, window)
        count = limit - first
        sees = lambda j: tir.index(j).cmp("lt", tir.index(count))  # noqa: E731
        row_of = lambda j: row(j + first)  # noqa: E731
        last = count - 1  # a query sees at least one key

    def tile(base, prologue: tuple[Stmt, ...] = ()) -> Stmt:
        """Keys base .. base + KT - 1: their rows of the kv head loaded by all T threads together (consecutive
        threads, consecutive elements), then each thread's keys (lane, lane + Tg, ...) into its head's online
        softmax from shared memory; a barrier after each half. `prologue` (an appending attention's: its queries,
        and where the tile holds the new key, that key's row, which the loads leave to it) before the first.

        The loads name a key no further than the last one the query may read (`last`), so none is guarded: a key
        past it loads that key's row again, which no thread uses (the keys' loop tests each). They go COPY_BATCH
        trips at a time into registers, then into the tile (lowering.batched_copy): guarded, a trip at a time, each
        waited for its loads (43 round trips to memory a tile of SmolLM2's in nvcc's SASS; ~30 us a layer on an
        H200). Only the last trip, where the tile's elements are not a multiple of the threads, tests that its
        stores are inside the tile."""
        def trip(xv):
            at = xv * T + U
            kk, c = sym.floordiv(at, D), sym.mod(at, D)
            J = row_of(sym.smin(base + kk, last))
            guard = tir.index(at).cmp("lt", tir.index(KT * D)) if (KT * D) % T else None  # the tile's last trip
            if append is not None:  # the new key's row is the prologue's: the loads that would read it (a race with
                # its store) read the cache's next row instead, which nothing writes, and store nothing
                fresh = tir.index(sym.smin(base + kk, last)).cmp("ne", tir.index(last))
                J = tir.select(fresh, tir.index(J), tir.index(sym.mod(row_of(last) + 1, K.shape[0])))
                guard = fresh if guard is None else tir.V("and", "bool", (guard, fresh))
            return [(sm, kk * P + c, kv_value(K, J, kv, c)), (sm, (kk + KT) * P + c, kv_value(Vb, J, kv, c))], guard
        load = batched_copy("kv", -(-(KT * D) // T), trip, COPY_BATCH)
        y = sym.SymVar("y")
        key = sym.as_expr(y) * Tg + lane
        step = key_step(q_of, lambda e: sm[key * P + e], lambda e: sm[(key + KT) * P + e],
                        scale, cap, (m, l, sc, corr, pr, acc), over_d, lanes)
        return Seq((load, *prologue, Barrier(), For(y, sym.as_expr(SPLIT_KEYS_PER_THREAD),
                                                    IfThenElse(sees(base + key), step)), Barrier()))

    if splits and append is not None:  # the queries into shared memory; the block holding the new key stores it
        new = count - 1 - sidx * KT  # in the cache and in its tile (holds: the block's split is the new key's)
        holds = tir.index(sym.floordiv(count - 1, KT)).cmp("eq", tir.index(sidx))
        keys: Stmt = tile(sidx * KT, (append.prologue(kv, U, T, G, sm_q, holds, lambda which, c, value: Store(
            sm, ((new + (KT if which == "v" else 0)) * P + c,), value)),))
    elif splits:
        keys = tile(sidx * KT)
    else:
        tt = sym.SymVar("tt")
        keys = For(tt, sym.floordiv(count + (KT - 1), KT), tile(sym.as_expr(tt) * KT))

    def threads_merged(a_, c) -> Stmt:
        """Head a_'s element c over its Tg threads' partials."""
        return merge(Tg, lambda v: sm_m[a_ * Tg + v], lambda v: sm_l[a_ * Tg + v],
                     lambda v: sm[(a_ * Tg + v) * P + c], (mx, tot, out))

    W = D + 2  # a block's partial in the workspace: maximum, sum, then the accumulator
    bound = sym.smin(n, SPLIT_ROWS) if paged else n  # the rows whose partials the workspace holds
    part = Buffer("part", (h * bound * S * W,), "float32", "global")

    def write(a_, c) -> Stmt:
        """Element c of head a_: with `splits` the partial (maximum and sum at c == 0, the accumulator's element,
        at ((head, query) row, split) as the combine reads it), else the output."""
        head = kv * G + a_
        if not splits:
            return Seq((threads_merged(a_, c), Store(O, (i, head, c), out[0] / tot[0])))
        base = ((head * n + i) * S + sidx) * W
        return Seq((
            threads_merged(a_, c),
            IfThenElse(tir.index(c).cmp("eq", tir.index(0)), Seq((Store(part, (base,), mx[0]),
                                                                   Store(part, (base + 1,), tot[0])))),
            Store(part, (base + 2 + c,), out[0]),
        ))

    E = (G * D + T - 1) // T  # the block's outputs, G heads x D elements, a thread

    def output_of(cc):
        """A thread's output cc: its head of the group, its element, and a guard where the last may be past G x D."""
        e_at = cc * T + U
        guard = tir.index(e_at).cmp("lt", tir.index(G * D)) if (G * D) % T else None
        return sym.floordiv(e_at, D), sym.mod(e_at, D), guard

    def over_outputs(f) -> Stmt:
        """f(head a_ of the group, element c) for each of the thread's outputs."""
        cc = sym.SymVar("cc")
        a_, c, guard = output_of(sym.as_expr(cc))
        return For(cc, sym.as_expr(E), IfThenElse(guard, f(a_, c)) if guard is not None else f(a_, c))

    arrive = splits and target.grid_arrivals
    arrived = Buffer(ARRIVED, (K.shape[1] * bound,), "int32", "global")  # a count a (kv head, query) row
    last = Buffer("last", (1,), "int32", "shared")  # whether this block arrived last at its row

    def partials_of(cc):
        """The last block of row r combines its heads' outputs from the row's S partials (combine_partials)."""
        a_, c, guard = output_of(cc)
        return ((kv * G + a_) * n + i) * S * W, c, lambda v: Store(O, (i, kv * G + a_, c), v), guard

    tail: tuple[Stmt, ...] = ()
    trips = None
    if arrive:  # the partials stored by every thread, one counts the block in; the last block combines the row's
        combine, trips = combine_partials(part, S, W, E, partials_of)
        tail = (Barrier(),
                IfThenElse(tir.index(U).cmp("eq", tir.index(0)),
                           Intrin("grid.arrive", (arrived, last), (r, S), writes=(arrived, last))),
                Barrier(),
                IfThenElse(last[0].cmp("ne", tir.const(0, "int32")), combine))
    body: Stmt = Seq((
        Store(m, z, tir.const(NEG)), Store(l, z, tir.const(0.0)),
        over("c", D, lambda c: Store(acc, (c,), tir.const(0.0))),
        keys,  # ends with a barrier: the tile's memory is free for the partials
        Store(sm_m, (U,), m[0]), Store(sm_l, (U,), l[0]),
        over("c", D, lambda c: Store(sm, (U * P + c,), acc[c])),
        Barrier(),
        over_outputs(write),
    ) + tail)
    for buf in (m, l, sc, corr, pr, mx, tot, out, acc):
        body = Alloc(buf, body)
    for buf in (sm_m, sm_l, sm) + ((last,) if arrive else ()) + ((sm_q,) if append is not None else ()):
        body = Alloc(buf, body)
    blocks = K.shape[1] * n * S
    body = For(g, blocks, For(u, sym.as_expr(T), body, "thread", "local"), "thread", "group")
    params = list(prog.params) + ([part] if splits else []) + ([arrived] if arrive else [])
    bufs, written = global_buffers(body, params)
    k = Kernel(prog.name + ("_part" if splits else ""), bufs, tuple(free_syms(body)), body, blocks, T, written,
               tail=trips)
    if not splits:
        return (k,), ()
    if arrive:
        return (k,), (part, arrived)
    name = prog.name + ("_merge" if paged else "")  # a page pool's row kernel keeps the program's name
    return (k, combine_splits(O, target, part, S, W, name)), (part,)


SPLIT_KEYS_PER_THREAD = 2  # a tile of the split form is 2 T keys, and a split block's share
COPY_BATCH = 16  # trips of a tile's copy whose loads are in flight together (two floats each: 32 registers)


def _kernel(prog: TensorProgram, target, rows, body_of) -> Schedule:
    """One thread per (head, query) row: the attention kernel of either form."""
    body, groups = thread_grid(rows, target.threads_per_block, body_of)
    bufs, written = global_buffers(body, list(prog.params))
    k = Kernel(prog.name, bufs, tuple(free_syms(body)), body, groups, target.threads_per_block, written)
    return Schedule((k,), (), "attention")
