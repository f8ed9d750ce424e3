"""Rule (cpu): matmuls on group-quantized weights as integer dot products (tensorization).

The activations are quantized to 8 bits per block of 32 (a scale d and d * the block's code sum),
once per call of the kernel by every worker into its own stack arrays (a few hundred nanoseconds
for a hidden size of 576 to 1536, cheaper than a separate kernel and a barrier), and each output
row is a sum over blocks of scale_w * scale_x * (integer dot of codes) plus a per-block correction
(the symmetric schemes' zero point, the asymmetric scheme's minimum). The block dot is an
intrinsic (`Intrin`) that targets/c_intrin.py writes per ISA: AVX-512 VNNI / AVX-VNNI `vpdpbusd`,
AVX2 `vpmaddubsw` + `vpmaddwd`, and plain C elsewhere (the place for ARM `sdot`).

The rule takes only a program that says its activations are rounded to 8 or 16 bits (attrs activations: the
graph's round_activations absorbed into the linear, transform/absorb_rounding.py), since that rounding is what
the integer arithmetic computes (16 bits: int16 codes, `vpmaddwd` / `vpdpwssd`, plain and interleaved); and
every such program must be taken (schedule checks). Which weight formats qualify is not read from names or
attributes: the rule takes the matmul's weight
expression W(n, k) as the fused program computes it and checks it, by evaluating both on random
codes, scales and minimums at random (n, k), against each known block format (Mirage's
probabilistic equivalence check, for one expression): 4-bit symmetric (code - 8) * s, 4-bit
asymmetric code * s + m, 8-bit symmetric (code - 128) * s, codes packed little end first into
uint32 words, one scale per 32 inputs; and the same two 4-bit formats with rows interleaved in 16s
(quantization/group.py InterleavedScheme: codes [N/16, K/32, 64]), whose kernels put one output in
each lane of a 512-bit register. Anything else (GGUF blocks kept as stored, float weights) is left
to the next rule.

Prefill (more than one row, a symbolic count) is two kernels: every row of x quantized once into
workspace buffers (a group per row, so the workers share the work), then TILE rows of one output
per group (interleaved: of 16 outputs), each weight block unpacked once and dotted with the TILE
rows' activations.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..ir import sym, tir
from ..ir.kernel import Kernel, Schedule, allocs_of, free_syms, global_buffers
from ..ir.tir import Alloc, Block, Buffer, For, IfThenElse, Intrin, Seq, Stmt, Store, TensorProgram, V
from ..ir.tir_interp import _SYM_NP_OPS, _Exec
from ..ir.tir_rewrite import Substitute
from .lowering import localize, lower_block, matmul_with_epilogues, split_matmul, thread_grid, unravel

BLOCK = 32
TILE = 4  # prefill rows per group: each unpacked weight block is used TILE times from registers
OUT_BLOCK = 64  # prefill outputs per block: 64 weight rows of 576 4-bit values are 28 KB (L1)
# name -> (bits, symmetric, zero point): the block formats the intrinsics implement
FORMATS = {"q4_sym": (4, True, 8), "q4_asym": (4, False, 0), "q8_sym": (8, True, 128),
           "q4_sym_x16": (4, True, 8), "q4_asym_x16": (4, False, 0), "q5_sym_x16": (5, True, 16),
           "q5_asym_x16": (5, False, 0), "q8_sym_x16": (8, True, 0), "q4_k_x16": (4, False, 0),
           "q5_k_x16": (5, False, 0), "q6_k_x16": (6, True, 32)}  # q8_sym_x16: signed bytes (GGUF Q8_0's)
HALVES = {"q6_k_x16"}  # formats with a scale per 16 values: their kernels take the activations' code sum per half
ACTIVATION_BITS = (8, 16)  # op/linalg.py round_activations; 16 where calibration says 8 costs too much
LANES = 16  # outputs per group of the interleaved formats (quantization/group.py InterleavedScheme)


def product_matmul(prog: TensorProgram):
    """(matmul, epilogues, its summand x * w, the output's iterator, the reduction's, K, N) of a program whose first
    block sums a product over one reduce iterator and whose other blocks are its epilogues, or None (this rule's and
    schedule/dp4a.py's starting point)."""
    found = split_matmul(prog)
    if found is None or found[2].op != "mul":
        return None
    mm, epilogues, rhs = found
    if not matmul_with_epilogues(mm, epilogues, allocs_of(prog.body)):
        return None
    n_it, k_it = mm.spatial[-1], mm.reduce[0]
    return mm, epilogues, rhs, n_it, k_it, sym.as_expr(k_it.extent), sym.as_expr(n_it.extent)


def rule(prog: TensorProgram, target) -> Schedule | None:
    bits = prog.attrs.get("activations")
    if not (target.core_loops and target.integer_kernels) or bits not in ACTIVATION_BITS:
        return None
    found = product_matmul(prog)
    if found is None:
        return None
    mm, epilogues, rhs, n_it, k_it, K, N = found
    spatial = mm.spatial
    if not (K.is_const and K.value % BLOCK == 0 and K.value <= 1 << 16):
        return None
    found = _operands(rhs, n_it.var, k_it.var, K.value, prog, {it.var: it.extent for it in spatial[:-1]})
    if found is None:
        return None
    x_load, x_flat, w_expr = found
    fmt = _format(w_expr, n_it.var, k_it.var, N, K.value, prog)
    stored = None
    if fmt is None:
        found = _format_kx16(w_expr, n_it.var, k_it.var, N, K.value, prog) or \
            _format_stored(w_expr, n_it.var, k_it.var, N, K.value, prog)
        if found is None:
            return None
        fmt, stored = (found[0], None, None, None), found[1]
    name, q, s, mins, *high = fmt
    m = Matmul(prog, mm, epilogues, spatial, n_it.var, k_it.var, K.value, N, x_load.arg[0], x_flat, name, q, s, mins,
               bits, stored, high[0] if high else None)
    rows = sym.as_expr(1)
    for it in spatial[:-1]:
        rows = rows * it.extent
    return m.gemv() if rows.is_const and rows.value == 1 else m.gemm(rows)


def is_integer(s: Schedule) -> bool:
    """Whether a schedule is this rule's or schedule/dp4a.py's (integer dot products on rounded activations)."""
    return s.rule.startswith(("qgemv-", "qgemm-", "gemv-dp4a-"))


@dataclass
class Matmul:
    """What both schedules need: the program, its matmul and epilogues, the input x (read at x_flat + k
    for a row whose other spatial iterators are set) and the weight format."""

    prog: TensorProgram
    mm: Block
    epilogues: list
    spatial: list
    n: sym.SymVar
    k: sym.SymVar
    K: int
    N: sym.Expr
    x: Buffer
    x_flat: sym.Expr
    fmt: str
    q: Buffer
    s: Buffer
    mins: Buffer | None
    bits: int = 8  # the activations' rounding (ACTIVATION_BITS)
    stored: tuple[Buffer, ...] | None = None  # a GGUF format kept as stored: its packed parameters, in order
    high: Buffer | None = None  # the interleaved 5-bit formats' fifth bits

    @property
    def codes(self) -> str:
        """The activation codes' element type (int8 or int16)."""
        return f"int{self.bits}"

    @property
    def nb(self) -> int:
        return self.K // BLOCK

    @property
    def interleaved(self) -> bool:
        return self.fmt.endswith("_x16")

    @property
    def weights(self) -> tuple[Buffer, ...]:
        if self.stored is not None:
            return self.stored
        return (self.q,) + ((self.high,) if self.high is not None else ()) + (self.s,) + \
            ((self.mins,) if self.mins is not None else ())

    @property
    def sums(self) -> int:
        """Activation code sums (d * sum) per block of 32: 2 for the stored formats' engine and the interleaved
        formats with sub-blocks of 16 (one per half), else 1."""
        return 2 if (self.stored is not None and not self.interleaved) or self.fmt in HALVES else 1

    def quantize(self, xq: Buffer, xd: Buffer, xs: Buffer, coords: dict, row) -> Intrin:
        """Activations of one row (the spatial iterators at `coords`) into row `row` of xq/xd/xs."""
        off = Substitute(syms={**coords, self.k: sym.as_expr(0)}, fresh=False).expr(self.x_flat)
        if self.sums == 2:
            kind = "k"
        else:
            kind = "pairs" if FORMATS[self.fmt][0] == 4 and not self.interleaved else "linear"
        return Intrin(f"quantize_q{self.bits}_{kind}", (self.x, xq, xd, xs), (off, sym.as_expr(self.K), sym.as_expr(row)),
                      (xq, xd, xs))

    def tail(self, coords: dict, value: V, tag: str) -> Stmt:
        """The matmul's store at `coords` (every spatial iterator) of init + value, then the epilogues there."""
        sub = Substitute(syms=coords, fresh=False)
        out = self.mm.body.buffer
        result = Store(out, tuple(sub.expr(i) for i in self.mm.body.indices), sub.value(self.mm.init.value) + value)
        stmt: Stmt = Seq((result,) + tuple(
            lower_block(e, {a.var: coords[b.var] for a, b in zip(e.iters, self.spatial)}, f"e{tag}_{i}")
            for i, e in enumerate(self.epilogues)))
        if out in allocs_of(self.prog.body):
            local = Buffer(f"{out.name}{tag}", (1,), out.dtype, "local")
            stmt = Alloc(local, localize(stmt, out, local, len(out.shape)))
        return stmt

    def kernel(self, name: str, body: Stmt, groups, order) -> Kernel:
        bufs, written = global_buffers(body, order)
        return Kernel(name, bufs, tuple(free_syms(body)), body, groups, 1, written)

    @property
    def width(self) -> int:
        """Outputs per group (one Intrin): 16 for the interleaved formats, else 1."""
        return LANES if self.interleaved else 1

    def stores(self, acc: Buffer, coords_of, g: sym.Expr, rows_here: int, guard_of) -> Stmt:
        """acc[i * width + l] -> output g * width + l of row i (the tail and epilogues), i < rows_here;
        guard_of(i) is None or the condition for row i to exist."""
        i, lane = sym.SymVar("i"), sym.SymVar("l")
        I, L = sym.as_expr(i), sym.as_expr(lane)
        store: Stmt = For(lane, sym.as_expr(self.width),
                          self.tail({**coords_of(I), self.n: g * self.width + L}, acc[I * self.width + L], ""))
        cond = guard_of(I)
        return For(i, sym.as_expr(rows_here), store if cond is None else IfThenElse(cond, store))

    def gemv(self) -> Schedule:
        """Decode: every worker quantizes x into its own stack arrays, then `width` outputs per group."""
        xq = Buffer("xq", (self.K,), self.codes, "local")
        xd = Buffer("xd", (self.nb,), "float32", "local")
        xs = Buffer("xsd", (self.nb * self.sums,), "float32", "local")  # d * (sum of the block's codes)
        acc = Buffer("acc", (self.width,), "float32", "local")
        zero = {it.var: sym.as_expr(0) for it in self.spatial[:-1]}

        def group_of(g: sym.Expr):
            dot = Intrin(f"dot_{self.fmt}_q{self.bits}", (acc, *self.weights, xq, xd, xs), (g, sym.as_expr(self.nb)), (acc,))
            return Alloc(acc, Seq((dot, self.stores(acc, lambda _i: zero, g, 1, lambda _i: None))))

        grid, groups = thread_grid(sym.floordiv(self.N, self.width), 1, group_of)
        body = Alloc(xq, Alloc(xd, Alloc(xs, Seq((self.quantize(xq, xd, xs, zero, 0), grid)))))
        return Schedule((self.kernel(self.prog.name, body, groups, list(self.prog.params)),), (), f"qgemv-{self.fmt}")

    def gemm(self, rows: sym.Expr) -> Schedule:
        """Prefill: one kernel quantizes every row of x into workspace buffers (a group per row), a second
        computes TILE rows of `width` outputs per group, unpacking each weight block once for all of them
        (rows past the end repeat the last one and store nothing)."""
        xq = Buffer("xq", (rows, self.K), self.codes, "global")
        xd = Buffer("xd", (rows, self.nb), "float32", "global")
        xs = Buffer("xsd", (rows, self.nb * self.sums), "float32", "global")
        order = list(self.prog.params) + [xq, xd, xs]
        extents = [it.extent for it in self.spatial[:-1]]

        def coords(row: sym.Expr) -> dict:
            return {it.var: v for it, v in zip(self.spatial[:-1], unravel(row, extents))}

        q_grid, q_groups = thread_grid(rows, 1, lambda r: self.quantize(xq, xd, xs, coords(r), r))
        acc = Buffer("acc", (sym.as_expr(TILE * self.width),), "float32", "local")
        tiles = sym.floordiv(rows + (TILE - 1), TILE)
        n_groups = sym.floordiv(self.N, self.width)
        # Groups in blocks of OUT_BLOCK outputs (their weight rows stay in L1), each block over every row
        # tile (the quantized activations stay in L2); a thread's share is whole blocks of weight rows.
        per = math.gcd(n_groups.value, max(1, OUT_BLOCK // self.width)) if n_groups.is_const else 1

        def group_of(r: sym.Expr):
            blk, rest = sym.floordiv(r, tiles * per), sym.mod(r, tiles * per)
            tile, g = sym.floordiv(rest, per), blk * per + sym.mod(rest, per)
            t0 = tile * TILE
            dot = Intrin(f"dot_{self.fmt}_q{self.bits}_tile", (acc, *self.weights, xq, xd, xs),
                         (g, sym.as_expr(self.nb), t0, rows), (acc,))
            inside = lambda i: tir.index(t0 + i).cmp("lt", tir.index(rows))  # noqa: E731
            return Alloc(acc, Seq((dot, self.stores(acc, lambda i: coords(t0 + i), g, TILE, inside))))

        grid, groups = thread_grid(tiles * n_groups, 1, group_of)
        kernels = (self.kernel(f"{self.prog.name}_quantize", q_grid, q_groups, order),
                   self.kernel(self.prog.name, grid, groups, order))
        return Schedule(kernels, (xq, xd, xs), f"qgemm-{self.fmt}")


def _operands(rhs: V, n: sym.SymVar, k: sym.SymVar, K: int, prog: TensorProgram, rows: dict):
    """(x load, x's flat index, the other factor): x a float32 input read at consecutive elements as k runs
    (a reshape in front of the matmul is fine) and not by n; the other factor is the weight expression."""
    for a, b in ((rhs.src[0], rhs.src[1]), (rhs.src[1], rhs.src[0])):
        if a.op != "load" or a.dtype != "float32" or a.arg[0] not in prog.params:
            continue
        buf, idx = a.arg
        if any(isinstance(i, V) or n in sym.as_expr(i).free_vars() for i in idx):
            continue
        if any(ld.arg[0] is buf for ld in tir.loads(b)):
            continue
        flat, stride = sym.as_expr(0), sym.as_expr(1)
        for d, i in zip(reversed(buf.shape), reversed(idx)):
            flat = flat + sym.as_expr(i) * stride
            stride = stride * d
        if not _consecutive(flat, k, K, rows):
            continue
        return a, flat, b
    return None


def _consecutive(flat: sym.Expr, k: sym.SymVar, K: int, rows: dict) -> bool:
    """x[row, k] is element flat(row, 0) + k for every k < K: checked for every k at the first and the last
    row, with the sizes the index mentions (seq_len in a reshape's stride or modulus) at 1, 5 and 64."""
    ks = np.arange(K, dtype=np.int64)
    sizes = [v for v in flat.free_vars() if v is not k and v not in rows]
    for size in (1, 5, 64):
        env = {v: size for v in sizes}
        for last in (False, True):
            at_rows = {v: int(sym.evaluate(e, env)) - 1 if last else 0 for v, e in rows.items()}
            try:
                at = np.asarray(sym.evaluate(flat, {**env, **at_rows, k: ks}, _SYM_NP_OPS), dtype=np.int64)
            except KeyError:  # an index that needs a variable no row or size binds: not this rule's shape
                return False
            at = np.broadcast_to(at, (K,))
            if not np.array_equal(at - at[0], ks):
                return False
    return True


def _format(w: V, n: sym.SymVar, k: sym.SymVar, N: sym.Expr, K: int, prog: TensorProgram):
    """(format name, codes, scales, minimums or None) when W(n, k) equals a known block format."""
    bufs = {ld.arg[0] for ld in tir.loads(w)}
    if any(b.scope != "global" or b not in prog.params for b in bufs):
        return None
    codes = [b for b in bufs if b.dtype == "uint32"]
    scales = [b for b in bufs if b.dtype == "float16"]
    if any(not all(sym.as_expr(d).is_const for d in b.shape) for b in bufs):
        return None
    if len(codes) == 2 and len(scales) in (1, 2) and len(bufs) == 2 + len(scales) and \
            all(len(b.shape) == 3 for b in bufs):  # the interleaved 5-bit formats: low nibbles and fifth bits
        q, qh = sorted(codes, key=lambda b: -sym.as_expr(b.shape[2]).value)
        return _format_x16(w, n, k, N, K, q, scales, qh)
    if len(codes) != 1 or len(scales) not in (1, 2) or len(bufs) != 1 + len(scales):
        return None
    q = codes[0]
    if len(q.shape) == 3:
        return _format_x16(w, n, k, N, K, q, scales)
    if any(len(b.shape) != 2 for b in bufs):
        return None
    rows = sym.as_expr(q.shape[0]).value
    if not (N.is_const and N.value == rows) or any(sym.as_expr(b.shape[0]).value != rows for b in scales):
        return None
    if any(sym.as_expr(b.shape[1]).value != K // BLOCK for b in scales):
        return None
    rng = np.random.default_rng(0)
    pts = 64
    nn = rng.integers(0, rows, pts)
    kk = rng.integers(0, K, pts)
    for name, (bits, symmetric, zero) in FORMATS.items():
        if name.endswith("_x16") or (len(scales) == 1) != symmetric or sym.as_expr(q.shape[1]).value * (32 // bits) != K:
            continue
        for s, m in ([(scales[0], None)] if symmetric else [(scales[0], scales[1]), (scales[1], scales[0])]):
            arrays = {q: rng.integers(0, 1 << 32, (rows, K * bits // 32), dtype=np.uint64).astype(np.uint32),
                      s: rng.uniform(0.5, 2.0, (rows, K // BLOCK)).astype(s.dtype),
                      **({m: rng.uniform(-2.0, 2.0, (rows, K // BLOCK)).astype(m.dtype)} if m is not None else {})}
            try:
                got = _Exec(arrays).value(w, {n: nn, k: kk}).astype(np.float64)
            except Exception:  # noqa: BLE001 - an expression the interpreter cannot run is no match
                return None
            per = 32 // bits
            code = (arrays[q][nn, kk // per].astype(np.int64) >> (bits * (kk % per))) & ((1 << bits) - 1)
            sc = arrays[s][nn, kk // BLOCK].astype(np.float64)
            want = (code - zero) * sc + (arrays[m][nn, kk // BLOCK].astype(np.float64) if m is not None else 0.0)
            if got.shape == want.shape and np.allclose(got, want, rtol=1e-6, atol=1e-6):
                return name, q, s, m
    return None


def _format_x16(w: V, n: sym.SymVar, k: sym.SymVar, N: sym.Expr, K: int, q: Buffer, scales: list[Buffer],
                qh: Buffer | None = None):
    """The interleaved formats: 4-bit (InterleavedScheme: codes [N/16, K/32, 64], scales [N/16, K/32, 16]), 8-bit
    (signed bytes [N/16, K/32, 128]) and, with fifth bits `qh` [N/16, K/32, 16], GGUF's Q5_0 / Q5_1
    (quantization/gguf_blocks.py InterleavedQ5), recognised, as the plain ones, by evaluating W at random points
    against the layout's definition."""
    nb = K // BLOCK
    if not (N.is_const and N.value % LANES == 0):
        return None
    g = N.value // LANES
    dims = lambda b: tuple(sym.as_expr(d).value for d in b.shape)  # noqa: E731
    symmetric = len(scales) == 1
    bits = 5 if qh is not None else 8 if dims(q) == (g, nb, 8 * LANES) and symmetric else 4
    words = (8 if bits == 8 else 4) * LANES  # per group and block: 16 lanes of 8 quads of bytes, or 4 of nibble pairs
    if dims(q) != (g, nb, words) or any(dims(b) != (g, nb, LANES) for b in scales + ([qh] if qh else [])):
        return None
    rng = np.random.default_rng(0)
    pts = 64
    nn, kk = rng.integers(0, N.value, pts), rng.integers(0, K, pts)
    zero = {4: 8, 5: 16, 8: 0}[bits]
    for s, m in ([(scales[0], None)] if symmetric else [(scales[0], scales[1]), (scales[1], scales[0])]):
        arrays = {q: rng.integers(0, 1 << 32, dims(q), dtype=np.uint64).astype(np.uint32),
                  s: rng.uniform(0.5, 2.0, dims(s)).astype(s.dtype),
                  **({m: rng.uniform(-2.0, 2.0, dims(m)).astype(m.dtype)} if m is not None else {}),
                  **({qh: rng.integers(0, 1 << 32, dims(qh), dtype=np.uint64).astype(np.uint32)} if qh else {})}
        try:
            got = _Exec(arrays).value(w, {n: nn, k: kk}).astype(np.float64)
        except Exception:  # noqa: BLE001 - an expression the interpreter cannot run is no match
            return None
        grp, lane, blk, quad = nn // LANES, nn % LANES, kk // BLOCK, (kk % BLOCK) // 4
        if bits == 8:  # byte kk % 4 of word 16 quad + lane, signed
            code = ((arrays[q][grp, blk, quad * LANES + lane].astype(np.int64) >> (8 * (kk % 4))) & 255) ^ 128
            code = code - 128
        else:
            word = arrays[q][grp, blk, (quad % 4) * LANES + lane].astype(np.int64)
            code = (word >> (8 * (kk % 4) + 4 * (quad // 4))) & 15
        if qh is not None:
            at = (quad % 4) * LANES + lane
            hword = arrays[qh][grp, blk, at // 4].astype(np.int64)
            code = code | (((hword >> (8 * (at % 4) + kk % 4 + 4 * (quad // 4))) & 1) << 4)
        sc = arrays[s][grp, blk, lane].astype(np.float64)
        want = (code - zero) * sc if symmetric else code * sc + arrays[m][grp, blk, lane].astype(np.float64)
        if got.shape == want.shape and np.allclose(got, want, rtol=1e-6, atol=1e-6):
            return f"q{bits}_{'sym' if symmetric else 'asym'}_x16", q, s, m, qh
    return None


def _format_stored(w: V, n: sym.SymVar, k: sym.SymVar, N: sym.Expr, K: int, prog: TensorProgram):
    """("gguf_<type>", its packed buffers in parameter order) when W(n, k) equals a GGUF format kept as stored
    (quantization/gguf_blocks.py StoredScheme), recognised as the others are: evaluated at random points on random
    parameters, against the format's reference dequantization (gguf-py's)."""
    from ..quantization.gguf_stored import STORED

    return _match_layouts(w, n, k, N, K, prog, {f"gguf_{q.lower()}": s for q, s in STORED.items()}, 2)


def _format_kx16(w: V, n: sym.SymVar, k: sym.SymVar, N: sym.Expr, K: int, prog: TensorProgram):
    """("q4_k_x16", "q5_k_x16" or "q6_k_x16", its buffers in parameter order) when W(n, k) equals a K-quant with rows
    interleaved in 16s (quantization/gguf_stored.py InterleavedK, InterleavedQ6), recognised likewise against the
    layout's dequantization."""
    from ..quantization.gguf_stored import INTERLEAVED_K

    return _match_layouts(w, n, k, N, K, prog, {f"q{q[1]}_k_x16": s for q, s in INTERLEAVED_K.items()}, 3)


def _match_layouts(w: V, n: sym.SymVar, k: sym.SymVar, N: sym.Expr, K: int, prog: TensorProgram, schemes: dict,
                   rank: int):
    """(name, the buffers in the scheme's parameter order) of the first of `schemes` (name -> scheme, parameters of
    `rank` dimensions) whose dequantization W(n, k) equals at 64 random points on random parameters."""
    from itertools import permutations

    bufs = list(dict.fromkeys(ld.arg[0] for ld in tir.loads(w)))
    if not N.is_const or any(b.scope != "global" or b not in prog.params or len(b.shape) != rank or
                             not all(sym.as_expr(d).is_const for d in b.shape) for b in bufs):
        return None
    dims = {b: (tuple(sym.as_expr(d).value for d in b.shape), b.dtype) for b in bufs}
    rng = np.random.default_rng(0)
    nn, kk = rng.integers(0, N.value, 64), rng.integers(0, K, 64)
    for name, scheme in schemes.items():
        fits = getattr(scheme, "fits", None)  # the interleaved layouts' rows in 16s; the stored formats' whole blocks
        if not (fits(N.value, K) if fits else K % scheme.block == 0):
            continue
        shapes = [(tuple(shape), dtype) for shape, dtype in scheme.param_shapes(N.value, K).values()]
        if len(shapes) != len(bufs):
            continue
        for order in permutations(bufs):
            if [dims[b] for b in order] != shapes:
                continue
            arrays = {b: (rng.integers(0, 1 << 32, dims[b][0], dtype=np.uint64).astype(np.uint32) if b.dtype == "uint32"
                          else rng.uniform(0.5, 2.0, dims[b][0]).astype(b.dtype)) for b in order}
            try:
                got = _Exec(arrays).value(w, {n: nn, k: kk}).astype(np.float64)
            except Exception:  # noqa: BLE001 - an expression the interpreter cannot run is no match
                return None
            want = scheme.dequantize(dict(zip(scheme.param_shapes(N.value, K), (arrays[b] for b in order))), K)
            if got.shape == (64,) and np.allclose(got, want[nn, kk], rtol=1e-6, atol=1e-6):
                return name, tuple(order)
    return None
