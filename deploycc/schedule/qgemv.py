"""Rule (cpu): a decode GEMV on group-quantized weights as integer dot products (tensorization).

The activations are quantized to 8 bits per block of 32 (a scale and the block's code sum each),
once per call of the kernel by every worker into its own stack arrays (a few hundred nanoseconds
for a hidden size of 576 to 1536, cheaper than a separate kernel and a barrier), and each output
row is a sum over blocks of scale_w * scale_x * (integer dot of codes) plus a per-block correction
(the symmetric schemes' zero point, the asymmetric scheme's minimum). The block dot is an
intrinsic (`Intrin`) that targets/c_intrin.py writes per ISA: AVX-512 VNNI / AVX-VNNI `vpdpbusd`,
AVX2 `vpmaddubsw` + `vpmaddwd`, and plain C elsewhere (the place for ARM `sdot`).

Which weights qualify is not read from names or attributes: the rule takes the matmul's weight
expression W(n, k) as the fused program computes it and checks it, by evaluating both on random
codes, scales and minimums at random (n, k), against each known block format (Mirage's
probabilistic equivalence check, for one expression): 4-bit symmetric (code - 8) * s, 4-bit
asymmetric code * s + m, 8-bit symmetric (code - 128) * s, codes packed little end first into
uint32 words, one scale per 32 inputs. Anything else (GGUF blocks, float weights) is left to the
next rule. Prefill (more than one row) is left to the row rule's register tiles.
"""
from __future__ import annotations

import numpy as np

from ..ir import sym, tir
from ..ir.kernel import Kernel, Schedule, allocs_of, free_syms, global_buffers
from ..ir.tir import Alloc, Buffer, Intrin, Seq, Store, TensorProgram, V
from ..ir.tir_interp import _SYM_NP_OPS, _Exec
from ..ir.tir_rewrite import Substitute
from .lowering import localize, lower_block, matmul_with_epilogues, split_matmul, thread_grid

BLOCK = 32
# name -> (bits, symmetric, zero point): the block formats the intrinsics implement
FORMATS = {"q4_sym": (4, True, 8), "q4_asym": (4, False, 0), "q8_sym": (8, True, 128)}


def rule(prog: TensorProgram, target) -> Schedule | None:
    if target.kind != "cpu":
        return None
    found = split_matmul(prog)
    if found is None or found[2].op != "mul":
        return None
    mm, epilogues, rhs = found
    spatial = mm.spatial
    rows = sym.as_expr(1)
    for it in spatial[:-1]:
        rows = rows * it.extent
    if not (rows.is_const and rows.value == 1):
        return None
    if not matmul_with_epilogues(mm, epilogues, allocs_of(prog.body)):
        return None
    n_it, k_it = spatial[-1], mm.reduce[0]
    K, N = sym.as_expr(k_it.extent), sym.as_expr(n_it.extent)
    if not (K.is_const and K.value % BLOCK == 0 and K.value <= 1 << 16):
        return None
    fixed0 = {it.var: sym.as_expr(0) for it in spatial[:-1]}
    found = _operands(rhs, n_it.var, k_it.var, K.value, prog, fixed0)
    if found is None:
        return None
    x_load, x_off, w_expr = found
    fmt = _format(w_expr, n_it.var, k_it.var, N, K.value, prog)
    if fmt is None:
        return None
    name, q, s, m = fmt
    x_buf = x_load.arg[0]
    nb = K.value // BLOCK
    xq = Buffer("xq", (K.value,), "int8", "local")
    xd = Buffer("xd", (nb,), "float32", "local")
    xs = Buffer("xs", (nb,), "int32", "local")
    acc = Buffer("acc", (1,), "float32", "local")
    out = mm.body.buffer
    bits = FORMATS[name][0]

    def body_of(r: sym.Expr):
        fixed = {**fixed0, n_it.var: r}
        init = Substitute(syms=fixed, fresh=False).value(mm.init.value)
        dot = Intrin(f"dot_{name}_q8", (acc, q, s) + ((m,) if m is not None else ()) + (xq, xd, xs),
                     (r, sym.as_expr(nb)), (acc,))
        result = Store(out, tuple(Substitute(syms=fixed, fresh=False).expr(i) for i in mm.body.indices),
                       init + acc[0])
        tail = Seq((result,) + tuple(lower_block(e, {a.var: fixed[b.var] for a, b in zip(e.iters, spatial)}, f"e{i}")
                                      for i, e in enumerate(epilogues)))
        if out in allocs_of(prog.body):
            local = Buffer(out.name, (1,), out.dtype, "local")
            tail = Alloc(local, localize(tail, out, local, len(out.shape)))
        return Alloc(acc, Seq((dot, tail)))

    grid, groups = thread_grid(N, 1, body_of)
    quant = Intrin(f"quantize_q8_{'pairs' if bits == 4 else 'linear'}", (x_buf, xq, xd, xs), (x_off, K), (xq, xd, xs))
    body = Alloc(xq, Alloc(xd, Alloc(xs, Seq((quant, grid)))))
    bufs, written = global_buffers(body, list(prog.params))
    k = Kernel(prog.name, bufs, tuple(free_syms(body)), body, groups, 1, written)
    return Schedule((k,), (), f"qgemv-{name}")


def _operands(rhs: V, n: sym.SymVar, k: sym.SymVar, K: int, prog: TensorProgram, fixed0: dict):
    """(x load, flat offset of x[k=0]): x a float32 input read at consecutive elements as k runs (a reshape
    in front of the matmul is fine) and not by n; and the other factor, the weight expression."""
    for a, b in ((rhs.src[0], rhs.src[1]), (rhs.src[1], rhs.src[0])):
        if a.op != "load" or a.dtype != "float32" or a.arg[0] not in prog.params:
            continue
        buf, idx = a.arg
        if any(isinstance(i, V) or n in sym.as_expr(i).free_vars() for i in idx):
            continue
        if any(ld.arg[0] is buf for ld in tir.loads(b)):
            continue
        flat, stride = sym.as_expr(0), sym.as_expr(1)
        for d, i in zip(reversed(buf.shape), reversed(idx)):  # the single row: other spatial iterators are 0
            flat = flat + Substitute(syms=fixed0, fresh=False).expr(sym.as_expr(i)) * stride
            stride = stride * d
        if flat.free_vars() - {k}:
            continue
        ks = np.arange(K, dtype=np.int64)
        at = np.broadcast_to(np.asarray(sym.evaluate(flat, {k: ks}, _SYM_NP_OPS), dtype=np.int64), (K,))
        if not np.array_equal(at - at[0], ks):
            continue
        return a, Substitute(syms={k: sym.as_expr(0)}, fresh=False).expr(flat), b
    return None


def _format(w: V, n: sym.SymVar, k: sym.SymVar, N: sym.Expr, K: int, prog: TensorProgram):
    """(format name, codes, scales, minimums or None) when W(n, k) equals a known block format."""
    bufs = {ld.arg[0] for ld in tir.loads(w)}
    if any(b.scope != "global" or b not in prog.params for b in bufs):
        return None
    codes = [b for b in bufs if b.dtype == "uint32"]
    scales = [b for b in bufs if b.dtype == "float16"]
    if len(codes) != 1 or len(scales) not in (1, 2) or len(bufs) != 1 + len(scales):
        return None
    q = codes[0]
    if any(not all(sym.as_expr(d).is_const for d in b.shape) or len(b.shape) != 2 for b in bufs):
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
        if (len(scales) == 1) != symmetric or sym.as_expr(q.shape[1]).value * (32 // bits) != K:
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
