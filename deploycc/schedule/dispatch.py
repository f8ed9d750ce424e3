"""Rule: a matmul whose row count is known only at run time gets two kernels, one chosen per launch by that count.

A linear of the batched step (runtime/batch.py: one row per sequence decoding, a few more when one is prefilling)
or of a short prompt has M = a handful of rows, yet its shape says only `seq_len`: the prefill tiles (matmul.py,
mma.py) make 64 x 64 outputs a block, so at M = 4 an 8B Llama's 4,096-wide projection is 64 blocks on an H100's
132 SMs, each reading 1/64 of the weights at a block's pace (the server's step measured 6.5x slower than the
one-sequence decode GEMV: docs/gpu.md). This rule schedules both the few-row GEMV (gemv.few_rows, up to MANY rows)
and the tile kernel, and gives each a work-group count that is zero outside its range: `groups * [M <= MANY]` and
`groups * [M > MANY]`, written with min and max so the VM's shape arithmetic (runtime/symexpr.py, deploycc.js)
evaluates them, and a launch of zero work-groups is skipped (runtime/vm.py). Nimble's dispatch of a symbolic kernel
by its shape, with the choice in the launch's shape function rather than in a branch of the graph.
"""
from __future__ import annotations

from dataclasses import replace

from ..ir import sym
from ..ir.kernel import Schedule
from ..ir.tir import TensorProgram
from . import gemv, matmul, mma


def at_most(m: sym.Expr, n: int) -> sym.Expr:
    """1 where m <= n, else 0 (m >= 1)."""
    return sym.smax(0, sym.smin(1, n + 1 - m))


def above(m: sym.Expr, n: int) -> sym.Expr:
    """1 where m > n, else 0 (m >= 1)."""
    return sym.smin(1, sym.smax(0, m - n))


def rule(prog: TensorProgram, target) -> Schedule | None:
    p = matmul.prefill_matmul(prog, 2)
    if p is None or p.m_total.is_const:
        return None  # a constant row count takes one kernel: the decode GEMV or the tiles
    tiles = mma.codes_rule(prog, target) or mma.rule(prog, target) or matmul.rule(prog, target)
    few = gemv.few_rows(prog, target, p) if tiles is not None else None
    if few is None:
        return None
    m = p.m_total
    guarded = (replace(few, groups=few.groups * at_most(m, gemv.MANY)),
               *(replace(k, groups=k.groups * above(m, gemv.MANY)) for k in tiles.kernels))
    return Schedule(guarded, tiles.workspace, f"gemv|{tiles.rule}", dispatched=True)
