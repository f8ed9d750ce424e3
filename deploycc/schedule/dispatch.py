"""Rule: a matmul whose row count is known only at run time gets a kernel for each range of it, one chosen per launch.

A linear of the batched step (runtime/batch.py: one row per sequence decoding, a few more when one is prefilling)
or of a short prompt has M = a handful of rows, yet its shape says only `seq_len`: the prefill tiles (matmul.py,
mma.py) make 64 x 64 outputs a block, so at M = 4 an 8B Llama's 4,096-wide projection is 64 blocks on an H100's
132 SMs, each reading 1/64 of the weights at a block's pace (the server's step measured 6.5x slower than the
one-sequence decode GEMV: docs/gpu.md). This rule schedules the decode GEMV at one row (`one_row`: the server's
step of one sequence, where the few-row GEMV would make a chunk of FEW rows from one), the few-row GEMV
(gemv.few_rows) in chunks of SMALL rows and of FEW, up to MANY rows, and the tile kernel, and gives each a
work-group count that is zero outside its range: `groups * [M = 1]`, `[1 < M <= SMALL]`, `[SMALL < M <= MANY]` and
`[M > MANY]`, written with min and max so the VM's shape arithmetic (runtime/symexpr.py, deploycc.js) evaluates
them, and a launch of zero work-groups is skipped (runtime/vm.py). Nimble's dispatch of a symbolic kernel by its
shape, with the choice in the launch's shape function rather than in a branch of the graph; llama.cpp's MMVQ has a
kernel for each column count up to 8 alike. The schedule's rule names each alternative's, in kernel order
("gemv-split2|gemv-rows|gemv-rows|mma-codes"), which the performance model reads.
"""
from __future__ import annotations

from dataclasses import replace

from ..ir import sym
from ..ir.kernel import Schedule
from ..ir.tir import TensorProgram
from ..ir.tir_rewrite import Substitute
from . import gemv, matmul, mma


def at_most(m: sym.Expr, n: int) -> sym.Expr:
    """1 where m <= n, else 0 (m >= 1)."""
    return sym.smax(0, sym.smin(1, n + 1 - m))


def above(m: sym.Expr, n: int) -> sym.Expr:
    """1 where m > n, else 0 (m >= 1)."""
    return sym.smin(1, sym.smax(0, m - n))


def one_row(prog: TensorProgram, target, m: sym.Expr) -> Schedule | None:
    """The decode GEMV (gemv.rule: its K slices, a group's scale taken once) of `prog` where its row count `m`, a
    variable, is 1: the program with m = 1, its kernel renamed `_one`; the parameters keep their shapes (a kernel
    indexes row 0 of them alike). None where m is not one variable or the GEMV does not take the program."""
    var = m.as_var
    if var is None:
        return None
    sub = Substitute(buffers={b: b for b in prog.params}, syms={var: sym.as_expr(1)}, fresh=False)
    one = gemv.rule(TensorProgram(prog.name, prog.params, sub.stmt(prog.body), prog.sym_params, prog.num_outputs,
                                  dict(prog.attrs)), target)
    if one is None or len(one.kernels) != 1 or one.workspace:
        return None
    return replace(one, kernels=(replace(one.kernels[0], name=prog.name + "_one"),))


# The few-row GEMV's chunks of rows by the row counts they take: a step of up to SMALL rows (a few sequences) in
# chunks of SMALL, whose lanes hold half the sums and make half the products of a chunk of gemv.FEW; past it FEW.
SMALL = 4


def rule(prog: TensorProgram, target) -> Schedule | None:
    p = matmul.prefill_matmul(prog, 2)
    if p is None or p.m_total.is_const:
        return None  # a constant row count takes one kernel: the decode GEMV or the tiles
    tiles = mma.codes_rule(prog, target) or mma.rule(prog, target) or matmul.rule(prog, target)
    few = gemv.few_rows(prog, target, p) if tiles is not None else None
    if few is None:
        return None
    m = p.m_total
    one = one_row(prog, target, m)
    # (kernel, its rule, the most rows it takes), each taking the rows past the one before's
    bands = ([(one.kernels[0], one.rule, 1)] if one is not None else []) + [
        (gemv.few_rows(prog, target, p, SMALL), "gemv-rows", SMALL), (few, "gemv-rows", gemv.MANY)]
    kernels, low = [], 0
    for k, _, high in bands:
        groups = k.groups * at_most(m, high)
        kernels.append(replace(k, groups=groups * above(m, low) if low else groups))
        low = high
    kernels += [replace(k, groups=k.groups * above(m, gemv.MANY)) for k in tiles.kernels]
    return Schedule(tuple(kernels), tiles.workspace, "|".join([r for _, r, _ in bands] + [tiles.rule]),
                    dispatched=True)
