"""annotate_patterns: the pattern kind of every tensor program, from its loads, stores and loops.

Relax's analysis feedback (Algorithm 1): fusion decisions come from analysing the loop-level code,
not from a table of graph ops, so a hand-written tensor program (a custom dequantize loop, say) is
classified the same way as a legalized op.

Per block, with S the store indices:
- no reduce iterators: every load indexed exactly by S is ElementWise; by a subsequence of S's
  iterators (dropping some, in order) Broadcast; anything else (offsets, reshapes, gathers)
  Injective. A store not at the bare iterators is Injective too.
- reduce iterators: a product of two loads that both read along the reduce axis (a matmul) is
  OutputEwiseFusible; any other reduction is Reduction.
A program's kind combines its blocks: all at most Injective -> the largest; one OutputEwiseFusible
block followed only by elementwise/broadcast epilogues over its result -> OutputEwiseFusible;
reductions alone -> Reduction; anything else (e.g. attention: matmul, softmax and matmul) -> Opaque.
"""
from __future__ import annotations

from enum import IntEnum

from ..ir import sym
from ..ir.module import IRModule
from ..ir.tir import Block, Buffer, TensorProgram, V, loads, walk
from ..ir.tir_interp import reduction_parts


class Pattern(IntEnum):
    ELEMENTWISE = 0
    BROADCAST = 1
    INJECTIVE = 2
    REDUCTION = 3
    OUTPUT_EWISE_FUSIBLE = 4
    OPAQUE = 5


def annotate_patterns(mod: IRModule) -> IRModule:
    out = mod.with_functions(mod.functions)
    for name, prog in mod.programs().items():
        kind = analyze(prog)
        out.functions[name] = TensorProgram(prog.name, prog.params, prog.body, prog.sym_params, prog.num_outputs,
                                            {**prog.attrs, "pattern": kind.name})
    return out


def pattern_of(prog: TensorProgram) -> Pattern:
    """The annotated kind, or the analysed one for an unannotated program."""
    name = prog.attrs.get("pattern")
    return Pattern[name] if name else analyze(prog)


def analyze(prog: TensorProgram) -> Pattern:
    blocks = [s for s in walk(prog.body) if isinstance(s, Block)]
    if not blocks or any(b.iters and any(it.binding is not None for it in b.iters) for b in blocks):
        return Pattern.OPAQUE  # already scheduled, or nothing to analyse
    kinds = [block_pattern(b) for b in blocks]
    if max(kinds) <= Pattern.INJECTIVE:
        return max(kinds)
    if kinds[0] == Pattern.OUTPUT_EWISE_FUSIBLE and all(k <= Pattern.BROADCAST for k in kinds[1:]):
        if all(_reads_at_store(b, blocks[0].body.buffer) for b in blocks[1:]):
            return Pattern.OUTPUT_EWISE_FUSIBLE
    if all(k in (Pattern.REDUCTION,) or k <= Pattern.INJECTIVE for k in kinds):
        return Pattern.REDUCTION
    return Pattern.OPAQUE


def block_pattern(b: Block) -> Pattern:
    store = b.body
    if b.reduce:
        combine, rhs = reduction_parts(b)
        red = {it.var for it in b.reduce}
        # A matmul multiplies two different operands, both read along the reduce axis
        # (x[r, k] * x[r, k], a sum of squares, is a plain reduction).
        if (combine == "add" and rhs.op == "mul" and all(_load_uses(s, red) for s in rhs.src)
                and rhs.src[0] != rhs.src[1]):
            return Pattern.OUTPUT_EWISE_FUSIBLE
        return Pattern.REDUCTION
    idx = store.indices
    ivars = [i.as_var if isinstance(i, sym.Expr) else None for i in idx]
    if any(v is None for v in ivars) or len(set(ivars)) != len(ivars):
        return Pattern.INJECTIVE
    kind = Pattern.ELEMENTWISE
    for ld in loads(store.value):
        _, lidx = ld.arg
        if tuple(lidx) == tuple(idx):
            continue
        lvars = [i.as_var if isinstance(i, sym.Expr) else None for i in lidx]
        consts = [isinstance(i, sym.Expr) and i.is_const and i.value == 0 for i in lidx]
        kept = [v for v, c in zip(lvars, consts) if not c]
        if all(v is not None or c for v, c in zip(lvars, consts)) and _is_subsequence(kept, ivars):
            kind = max(kind, Pattern.BROADCAST)
        else:
            return Pattern.INJECTIVE
    return kind


def _is_subsequence(sub, seq) -> bool:
    it = iter(seq)
    return all(any(x is y for y in it) for x in sub)


def _load_uses(v: V, red: set) -> bool:
    """Some load in `v` reads along a reduce iterator (a factor may be a dequantized load)."""
    return any(any(isinstance(i, sym.Expr) and (i.free_vars() & red) for i in ld.arg[1]) for ld in loads(v))


def _reads_at_store(b: Block, buf: Buffer) -> bool:
    """Block `b` reads `buf` only at its own store indices (a true elementwise epilogue)."""
    for ld in loads(b.body.value):
        if ld.arg[0] is buf and tuple(ld.arg[1]) != tuple(b.body.indices):
            return False
    return True
