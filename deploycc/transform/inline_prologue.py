"""inline_prologue (GPU presets): a decode GEMV reads its input through the injective program that made it.

The MLP's down projection reads `silu(gate) * up`, which a program of its own computes from the merged gate/up
projection and writes to memory for the GEMV to read back: one launch a layer for a vector of a few thousand
elements, where on a GPU the launch costs more than the work. Here the GEMV's loads of that vector become the
producer's expression (fuse_tensor's compute_inline, across two call_tir): each lane recomputes the elements it
reads (a sigmoid and two loads each, shared by the rows of its lane group), and the producer's launch is gone.

An RMS norm before a GEMV (the q/k/v, gate-up and head projections read the normed hidden state) goes the same
way, its sum of squares included: y[n] = sum_k W[n, k] w[k] x[k] rsqrt(s / K + eps) with s = sum_k x[k]^2, where
the factor depends on no k, so the GEMV (schedule/gemv.py, "gemv-norm") sums s beside its rows' products from the
same loads of x and scales each row's sum by the factor once: two launches a layer fewer in decode, and no extra
bytes. Composed only where that rule schedules the result (`takes`), and not for a linear that rounds its input to
8 bits (--activations 8: the dp4a GEMV rounds x as it reads it from memory).

Taken when the consumer is a matmul with epilogues of one output row (decode: the prefill tiles would recompute the
prologue once per tile of outputs), the producer a single spatial block writing at its iterators (the inlining
rule of fuse_tensor), read by nothing else, and both programs of constant shapes (decode's). The CPU presets are not
affected: their fused programs stay byte for byte (their decode GEMVs are the integer kernels and the row rule).
"""
from __future__ import annotations

import re

from ..ir import sym
from ..ir.expr import Binding, BindingBlock, CallTIR, SeqExpr, with_body
from ..ir.kernel import allocs_of, strip_allocs
from ..ir.module import IRModule
from ..ir.tir import Alloc, Block, Buffer, Seq, TensorProgram, walk
from ..ir.tir_rewrite import Substitute
from .annotate_patterns import analyze
from .dce import dead_code_elimination, used_vars
from .fuse_tensor import _inlinable, _inline, _touches

# What is folded into the decode GEMVs; off only for benchmarks/gpu_fold.py's A/B on a GPU. Each saves a launch and
# costs instructions: a norm adds a fifth to its GEMV's (6.53 a weight against 5.50 in nvcc's SASS for sm_90); the
# gated product is recomputed by every lane group for the inputs it reads (the 1B's down projection, 512 lane
# groups: 12.19 a weight), where a kernel of its own computes each element once.
FOLD_NORMS = True
FOLD_GATED = True


def inline_prologues(mod: IRModule, takes=None) -> IRModule:
    """`takes(program)`: whether a norm may be folded into that GEMV (see _compose); None: no norm is."""
    out = mod.with_functions(mod.functions)
    for name, fn in mod.graph_functions().items():
        if fn.attrs.get("primitive"):
            continue
        uses = used_vars(fn)
        gone: set = set()
        blocks = []
        for blk in fn.body.blocks:
            made = {b.var: b for b in blk.bindings if isinstance(b, Binding) and isinstance(b.value, CallTIR)}
            bindings = []  # a producer in the consumer's own dataflow block (its inputs are in scope there)
            for b in blk.bindings:
                if isinstance(b, Binding) and isinstance(b.value, CallTIR) and blk.dataflow:
                    b = _inline_into(b, made, uses, out, gone, takes)
                bindings.append(b)
            blocks.append(BindingBlock(tuple(bindings), blk.dataflow))
        blocks = [BindingBlock(tuple(b for b in blk.bindings if b not in gone), blk.dataflow) for blk in blocks]
        out.functions[name] = with_body(fn, SeqExpr(tuple(blocks), fn.body.result))
    return dead_code_elimination(out)


def _inline_into(b: Binding, made: dict, uses: dict, mod: IRModule, gone: set, takes=None) -> Binding:
    call: CallTIR = b.value
    prog: TensorProgram = mod[call.program]
    if call.sym_args or not _one_row_matmul(prog) or "activations" in prog.attrs:
        return b  # (a linear that rounds its input reads it from a parameter: schedule/dp4a.py, kernel checks)
    for j, a in enumerate(call.args):
        p = made.get(a)
        if p is None or p in gone or uses.get(a) != 1 or p.value.sym_args:
            continue
        producer: TensorProgram = mod[p.value.program]
        fused = _compose(prog, j, producer, takes)
        if fused is None:
            continue
        gone.add(p)
        args = call.args[:j] + p.value.args + call.args[j + 1:]
        return Binding(b.var, CallTIR(mod.add_program(fused), args, call.out_ann, ()))
    return b


def _constant(prog: TensorProgram) -> bool:
    return not prog.sym_params and all(sym.as_expr(d).is_const for p in prog.params for d in p.shape)


def _one_row_matmul(prog: TensorProgram) -> bool:
    from ..schedule.lowering import split_matmul

    found = split_matmul(prog)
    if found is None or not _constant(prog):
        return False
    rows = 1
    for it in found[0].spatial[:-1]:
        rows *= sym.as_expr(it.extent).value
    return rows == 1


def _compose(consumer: TensorProgram, j: int, producer: TensorProgram, takes=None) -> TensorProgram | None:
    """`consumer` with its input j computed by `producer`'s block where it is read (None if it does not inline).
    A producer whose block reads sums it makes first into local buffers (an RMS norm: its sum of squares) is
    composed only where `takes` accepts the result (the GEMV rule, which accumulates the sum beside its rows')."""
    stmts, allocs = strip_allocs(producer.body), allocs_of(producer.body)
    if producer.num_outputs != 1 or not stmts or not _constant(producer) or not _inlinable(stmts[-1]):
        return None
    if (len(stmts) > 1 or allocs) and (takes is None or not FOLD_NORMS or not _row_sums(stmts[:-1], allocs)):
        return None
    if len(stmts) == 1 and not allocs and not FOLD_GATED:
        return None
    x = consumer.inputs[j]
    ins = [Buffer(f"p{i}", b.shape, b.dtype) for i, b in enumerate(producer.inputs)]
    sub = Substitute(dict(zip(producer.params, ins + [x])))
    made = sub.stmt(Seq(tuple(stmts)))
    body = _inline(Seq((made, consumer.body)), [x])
    if any(_touches(s, x) for s in walk(body)):
        return None
    if isinstance(body, Seq) and len(body.stmts) == 1:
        body = body.stmts[0]
    for a in allocs:
        body = Alloc(sub.buf(a), body)
    params = consumer.inputs[:j] + tuple(ins) + consumer.inputs[j + 1:] + consumer.outputs
    name = "fused_" + "_".join(re.sub(r"\d+$", "", p.name).removeprefix("fused_") for p in (producer, consumer))
    prog = TensorProgram(name, params, body, (), consumer.num_outputs, dict(consumer.attrs))
    # a sum, then the matmul, is fused with its epilogues all the same (analyze says opaque)
    pattern = "OUTPUT_EWISE_FUSIBLE" if allocs else analyze(prog).name
    prog = TensorProgram(name, params, body, (), consumer.num_outputs, {**prog.attrs, "pattern": pattern})
    return prog if not allocs or takes(prog) else None


def _row_sums(stmts: list, allocs: list) -> bool:
    """Each statement a block summing into one of the local buffers `allocs` (a norm's statistics)."""
    return all(isinstance(s, Block) and s.reduce and s.init is not None and s.body.buffer in allocs
               and s.body.buffer.scope == "local" for s in stmts)
