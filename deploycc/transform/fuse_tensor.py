"""fuse_tensor: merge each primitive function made by fuse_ops into one tensor program.

The members' programs are instantiated in order with their buffers bound to the function's
parameters, fresh intermediates, or the result, and their symbolic variables bound to the
function's (from the argument shapes and sym_args). Then every intermediate written by a spatial
block at exactly its iterators is inlined into its readers (compute_inline), so an injective
prologue or an elementwise chain leaves no buffer and no pass over memory behind. What remains,
e.g. a matmul block and its epilogue block, is one program the schedule turns into one kernel.
The call sites become call_tir, and the primitive functions are removed.
"""
from __future__ import annotations

from ..ir import annotation as A
from ..ir import sym
from ..ir.expr import Binding, BindingBlock, CallFunc, CallTIR, Function, SeqExpr, ShapeExpr, with_body
from ..ir.module import IRModule
from ..ir.tir import Alloc, Block, Buffer, Seq, Stmt, Store, TensorProgram, V, loads, walk
from ..ir.tir_rewrite import Substitute, inline_value, map_value, replace_loads
from .annotate_patterns import analyze
from .dce import dead_code_elimination
from .plan_memory import program_sym_map

# A linear of rounded activations (transform/absorb_rounding.py): one per fused program, at most.
KEPT_ATTRS = ("activations",)


def fuse_tensor(mod: IRModule, gathers: bool = False) -> IRModule:
    """gathers (GPU presets): an intermediate that a gather reads (indices that are values) is inlined too where its
    producer only relabels its input (_gathered_value)."""
    primitive = {n for n, f in mod.graph_functions().items() if f.attrs.get("primitive")}
    out = mod.with_functions({n: f for n, f in mod.functions.items() if n not in primitive})
    out.attrs.pop("_program_text", None)
    merged: dict[str, str] = {}
    for name, fn in mod.graph_functions().items():
        if fn.attrs.get("primitive"):
            prog = merge_function(fn, mod, gathers)
            merged[name] = out.add_program(prog)
    for name, fn in mod.graph_functions().items():
        if not fn.attrs.get("primitive"):
            out.functions[name] = _replace_calls(fn, mod, merged)
    return dead_code_elimination(out)


def _replace_calls(fn: Function, mod: IRModule, merged: dict[str, str]) -> Function:
    blocks = []
    for block in fn.body.blocks:
        bindings = []
        for b in block.bindings:
            v = b.value
            if isinstance(b, Binding) and isinstance(v, CallFunc) and v.func in merged:
                # The extra shape argument, if any, becomes the program's sym_args.
                tensors = tuple(a for a in v.args if not isinstance(a, ShapeExpr))
                shape = next((a for a in v.args if isinstance(a, ShapeExpr)), None)
                sym_args = tuple(shape.values) if shape is not None else ()
                b = Binding(b.var, CallTIR(merged[v.func], tensors, b.var.ann, sym_args))
            bindings.append(b)
        blocks.append(BindingBlock(tuple(bindings), block.dataflow))
    return with_body(fn, SeqExpr(tuple(blocks), fn.body.result))


def merge_function(fn: Function, mod: IRModule, gathers: bool = False) -> TensorProgram:
    tensor_params = [p for p in fn.params if isinstance(p.ann, A.TensorAnn)]
    shape_param = next((p for p in fn.params if isinstance(p.ann, A.ShapeAnn)), None)
    # Positional names, so that the same group in every layer prints alike and is shared.
    bufs = {p: Buffer(f"a{i}", p.ann.shape, p.ann.dtype) for i, p in enumerate(tensor_params)}
    result = fn.body.result
    out_buf = Buffer("out", result.ann.shape, result.ann.dtype)
    stmts: list[Stmt] = []
    intermediates: list[Buffer] = []
    bindings = [b for blk in fn.body.blocks for b in blk.bindings]
    kept = {}  # what a member's program says of its arithmetic that the fused program must keep saying
    for b in bindings:
        call: CallTIR = b.value
        prog: TensorProgram = mod[call.program]
        for key in KEPT_ATTRS:
            if key in prog.attrs:
                if kept.setdefault(key, prog.attrs[key]) != prog.attrs[key]:
                    raise ValueError(f"fuse_tensor: {fn.name} fuses programs of {key} {kept[key]} and "
                                     f"{prog.attrs[key]}")
        arg_bufs = [bufs[a] for a in call.args]
        if b.var is result:
            dst = out_buf
        else:
            dst = Buffer(f"t{len(intermediates)}", b.var.ann.shape, b.var.ann.dtype)
            intermediates.append(dst)
        bufs[b.var] = dst
        if prog.num_outputs != 1:
            raise ValueError(f"fuse_tensor: {prog.name} has {prog.num_outputs} outputs; fuse_ops groups single-output programs")
        sub = Substitute(dict(zip(prog.params, arg_bufs + [dst])), program_sym_map(prog, call))
        stmts.append(sub.stmt(prog.body))
    body = _inline(Seq(tuple(stmts)), intermediates, gathers)
    for buf in intermediates:
        if any(_touches(s, buf) for s in walk(body)):
            body = Alloc(buf, body)
    sym_params = tuple(v.as_var for v in shape_param.ann.values) if shape_param is not None else ()
    params = tuple(bufs[p] for p in tensor_params) + (out_buf,)
    name = fn.name.removeprefix("fused_")
    prog = TensorProgram("fused_" + name, params, body, sym_params, 1, {})
    return TensorProgram(prog.name, prog.params, prog.body, prog.sym_params, 1,
                         {**prog.attrs, **kept, "pattern": analyze(prog).name})


def _touches(st, buf: Buffer) -> bool:
    if isinstance(st, Store):
        return st.buffer is buf or any(ld.arg[0] is buf for ld in loads(st.value))
    return False


def _inline(body: Stmt, intermediates: list[Buffer], gathers: bool = False) -> Stmt:
    """compute_inline every intermediate written once, by a spatial block at its own iterators,
    and read only through symbolic indices; with `gathers`, also through a gather's where its producer only
    relabels its input (_gathered_value)."""
    changed = True
    while changed:
        changed = False
        stmts = list(body.stmts) if isinstance(body, Seq) else [body]
        flat = _flatten(stmts)
        for buf in intermediates:
            writers = [s for s in flat if isinstance(s, Block) and s.body.buffer is buf]
            if len(writers) != 1 or not _inlinable(writers[0]):
                continue
            if any(isinstance(s, Store) and s.buffer is buf for st in flat for s in walk(st) if s is not writers[0].body):
                continue
            producer = writers[0]
            reads = [ld.arg[1] for st in flat for s in walk(st) if isinstance(s, Store) for ld in loads(s.value)
                     if ld.arg[0] is buf]
            gathered = [idx for idx in reads if not all(isinstance(i, sym.Expr) for i in idx)]
            if gathered and not (gathers and all(_gathered_value(producer, idx) is not None for idx in gathered)):
                continue
            rest = [s for s in flat if s is not producer]
            body = Seq(tuple(replace_loads(s, buf, lambda idx: inline_value(producer, idx)
                                           if all(isinstance(i, sym.Expr) for i in idx) else _gathered_value(producer, idx))
                             for s in rest))
            changed = True
            break
    return body


def _gathered_value(producer: Block, idx: tuple) -> V | None:
    """The producer's value at indices some of which are values (a gather's: `take` reading the hidden states at each
    sequence's last token), where each of its loads reads at constants, its own iterators or neither (under its
    iterators' ranges: sym.simplify), as a reshape that only adds or drops axes of extent 1 does: those loads at the
    reader's indices, None otherwise (an index computed from an iterator cannot take a value)."""
    bounds = sym.Bounds()
    for it in producer.iters:
        bounds.declare(it.var, 0, sym.as_expr(it.extent) - 1)
    at = {it.var: i for it, i in zip(producer.iters, idx)}
    refused = []

    def relabel(x: V) -> V | None:
        if x.op == "index" and x.arg.free_vars() & at.keys():
            refused.append(x)
        if x.op != "load":
            return None
        out = []
        for e in x.arg[1]:
            e = e if isinstance(e, V) else sym.simplify(e, bounds)
            if isinstance(e, V) or not e.free_vars() & at.keys():
                out.append(e)
            elif e.as_var in at:
                out.append(at[e.as_var])
            else:
                refused.append(x)
                return None
        return V("load", x.dtype, (), (x.arg[0], tuple(out)))

    value = map_value(producer.body.value, relabel)
    return None if refused else value


def _flatten(stmts: list[Stmt]) -> list[Stmt]:
    out = []
    for s in stmts:
        out += _flatten(list(s.stmts)) if isinstance(s, Seq) else [s]
    return out


def _inlinable(b: Block) -> bool:
    if b.reduce or b.init is not None:
        return False
    idx = b.body.indices
    return len(idx) == len(b.iters) and all(isinstance(i, sym.Expr) and i.as_var is it.var
                                             for i, it in zip(idx, b.iters))

