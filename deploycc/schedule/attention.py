"""Rule: causal attention over the KV cache, one thread per (head, query), online softmax.

The legalized attention program materialises scores [heads, seq, total_len]; this rule never does.
Each thread streams over the keys it may see (j <= i + total_len - seq_len), keeping the running
maximum, the running sum and the output row in registers (the flash-attention recurrence), so
memory is O(head_dim) per thread for any total_len. Grouped-query heads read kv head h // group.
"""
from __future__ import annotations

from ..ir import sym, tir
from ..ir.kernel import Kernel, Schedule, free_syms, global_buffers
from ..ir.tir import Alloc, Buffer, For, IfThenElse, Seq, Store, TensorProgram
from .lowering import thread_grid

NEG = -1e30  # a finite -infinity: exp(NEG - s) == 0, and fast-math builds may assume no infinities


def rule(prog: TensorProgram, target) -> Schedule | None:
    if prog.attrs.get("op") != "attention" or len(prog.params) != 4:
        return None
    Q, K, Vb, O = prog.params
    n, h, d = Q.shape
    t, kvh, _ = K.shape
    if not d.is_const:
        return None
    group = sym.floordiv(h, kvh)
    scale = float(prog.attrs["scale"])

    def body_of(r):
        hh, i = sym.floordiv(r, n), sym.mod(r, n)
        kv = sym.floordiv(hh, group)
        z = (sym.as_expr(0),)
        m, l, s, mn, corr, pr = (Buffer(x, (1,), "float32", "local") for x in ("m", "l", "s", "m_new", "corr", "p"))
        acc = Buffer("acc", (d,), "float32", "local")
        j, k, c, c2, c3 = (sym.SymVar(x) for x in ("j", "k", "c", "c", "c"))
        J, Kk, C, C2, C3 = (sym.as_expr(x) for x in (j, k, c, c2, c3))
        step = Seq((
            Store(s, z, tir.const(0.0)),
            For(k, d, Store(s, z, s[0] + Q[i, hh, Kk] * K[J, kv, Kk])),
            Store(s, z, s[0] * scale),
            Store(mn, z, tir.vmax(m[0], s[0])),
            Store(corr, z, tir.unary("exp", m[0] - mn[0])),
            Store(pr, z, tir.unary("exp", s[0] - mn[0])),
            Store(l, z, l[0] * corr[0] + pr[0]),
            For(c, d, Store(acc, (C,), acc[C] * corr[0] + pr[0] * Vb[J, kv, C])),
            Store(m, z, mn[0]),
        ))
        visible = tir.index(J).cmp("le", tir.index(i + t - n))
        body = Seq((
            Store(m, z, tir.const(NEG)), Store(l, z, tir.const(0.0)),
            For(c2, d, Store(acc, (C2,), tir.const(0.0))),
            For(j, t, IfThenElse(visible, step)),
            For(c3, d, Store(O, (i, hh, C3), acc[C3] / l[0])),
        ))
        for buf in (m, l, s, mn, corr, pr, acc):
            body = Alloc(buf, body)
        return body

    body, groups = thread_grid(h * n, target.threads_per_block, body_of)
    bufs, written = global_buffers(body, list(prog.params))
    k = Kernel(prog.name, bufs, tuple(free_syms(body)), body, groups, target.threads_per_block, written)
    return Schedule((k,), (), "attention")
