"""fuse_ops: group call_tir bindings into subgraph functions by pattern kind (Relax Algorithm 2).

Within each dataflow block, a producer joins its consumer's group when its result has no other use
and the kinds allow it:
- injective chains: producer and consumer at most Injective;
- prologues: an at-most-Injective producer into a Reduction or OutputEwiseFusible consumer (the
  dequantize loop into its matmul, an add into the rms_norm that reads it). Into a matmul
  (OutputEwiseFusible), a prologue that computes on activations would run once per output column,
  so it must be pure data movement (a reshape, a slice) or read only weights (parameters and
  constants: the dequantize); silu(gate) * up before the down projection stays its own kernel;
- epilogues: an OutputEwiseFusible or Reduction group into an ElementWise/Broadcast consumer (the
  residual add after a projection), at most one such anchor per group.
Opaque programs never fuse. Each group of two or more becomes a function marked `primitive`, called
with CallFunc; its parameter annotations keep their symbolic shapes, and a variable that no
parameter dimension defines by itself arrives in an extra Shape parameter (see builder).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..ir import annotation as A
from ..ir import sym
from ..ir.builder import _param_defined_syms, with_shape_param
from ..ir.expr import (
    Binding,
    BindingBlock,
    CallFunc,
    CallTIR,
    Constant,
    Expr,
    Function,
    MatchCast,
    SeqExpr,
    ShapeExpr,
    Var,
    with_body,
)
from ..ir.module import IRModule
from .annotate_patterns import Pattern, pattern_of
from .dce import used_vars

ANCHORS = (Pattern.REDUCTION, Pattern.OUTPUT_EWISE_FUSIBLE)


@dataclass
class _Group:
    members: list[int] = field(default_factory=list)  # binding positions, in order
    others: Pattern = Pattern.ELEMENTWISE  # the largest kind among non-anchor members
    anchor: Pattern | None = None  # the group's Reduction/OutputEwiseFusible member, if any

    @property
    def kind(self) -> Pattern:
        return self.anchor if self.anchor is not None else self.others

    @property
    def anchored(self) -> bool:
        return self.anchor is not None


def fuse_ops(mod: IRModule) -> IRModule:
    out = mod.with_functions(mod.functions)
    for name, fn in mod.graph_functions().items():
        if fn.attrs.get("primitive"):
            continue
        out.functions[name] = _fuse_function(fn, out)
    return out


def _can_fuse(producer: _Group, consumer: _Group) -> bool:
    p, c = producer.kind, consumer.kind
    if Pattern.OPAQUE in (p, c):
        return False
    if p <= Pattern.INJECTIVE and (c <= Pattern.INJECTIVE or c in ANCHORS):
        return True
    # Epilogue: an anchored producer into a consumer that is still elementwise/broadcast only.
    return producer.anchored and not consumer.anchored and c <= Pattern.BROADCAST


def _cheap_prologue(members: list[Binding], fn: Function, mod: IRModule) -> bool:
    """Members that only move data, or whose outside inputs are all parameters or constants."""
    defined = {m.var for m in members}
    params = set(fn.params)
    outside = [a for m in members for a in m.value.args if isinstance(a, Var) and a not in defined]
    if all(a in params for a in outside):
        return True
    return all(_moves_only(mod[m.value.program]) for m in members)


def _rounds_a_computed_value(consumer: Binding, members: list[Binding], mod: IRModule) -> bool:
    """A rounding of activations (op/linalg.py round_activations: cuda's prefill) takes as prologues only what moves
    data: rounded after arithmetic computed in the same kernel, a value an ulp off the reference's (a GPU's expf
    against numpy's) can land on the other side of a code, so its kernel check could not hold it to a tolerance."""
    return mod[consumer.value.program].attrs.get("op") == "round_activations" and \
        not all(_moves_only(mod[m.value.program]) for m in members)


def _moves_only(prog) -> bool:
    """Every store of the program writes a value loaded as is (reshape, slice, permute, concat)."""
    from ..ir.tir import Store, walk

    stores = [st for st in walk(prog.body) if isinstance(st, Store)]
    return bool(stores) and all(st.value.op == "load" for st in stores)


def _fuse_function(fn: Function, mod: IRModule) -> Function:
    uses = used_vars(fn)
    blocks = []
    counter = [0]
    for block in fn.body.blocks:
        blocks.append(_fuse_block(block, fn, mod, uses, counter) if block.dataflow else block)
    return with_body(fn, SeqExpr(tuple(blocks), fn.body.result))


def _fuse_block(block: BindingBlock, fn: Function, mod: IRModule, uses: dict, counter: list) -> BindingBlock:
    bindings = block.bindings
    group_of: dict[Var, _Group] = {}
    owner: list[_Group | None] = [None] * len(bindings)
    for pos, b in enumerate(bindings):
        if isinstance(b, MatchCast) or not isinstance(b.value, CallTIR):
            continue
        kind = pattern_of(mod[b.value.program])
        g = _Group([pos], kind, None) if kind not in ANCHORS else _Group([pos], Pattern.ELEMENTWISE, kind)
        for arg in b.value.args:
            pg = group_of.get(arg) if isinstance(arg, Var) else None
            if pg is None or pg is g or uses.get(arg, 0) != 1 or bindings[pg.members[-1]].var is not arg:
                continue
            if _can_fuse(pg, g) and (g.anchor != Pattern.OUTPUT_EWISE_FUSIBLE or pg.anchored
                                     or _cheap_prologue([bindings[m] for m in pg.members], fn, mod)) \
                    and not _rounds_a_computed_value(b, [bindings[m] for m in pg.members], mod):
                g.members = sorted(pg.members + g.members)
                g.others = max(g.others, pg.others)
                g.anchor = g.anchor if g.anchor is not None else pg.anchor
                for m in pg.members:
                    owner[m] = g
        for m in g.members:
            owner[m] = g
        group_of[b.var] = g
    new_bindings: list = []
    emitted: set[int] = set()
    for pos, b in enumerate(bindings):
        g = owner[pos]
        if g is None or len(g.members) == 1:
            new_bindings.append(b)
            continue
        if pos != g.members[-1]:
            continue  # emitted as one call at the group's last member
        if id(g) in emitted:
            continue
        emitted.add(id(g))
        new_bindings.append(_make_group_call([bindings[m] for m in g.members], fn, mod, counter))
    return BindingBlock(tuple(new_bindings), block.dataflow)


def _make_group_call(members: list[Binding], fn: Function, mod: IRModule, counter: list) -> Binding:
    defined = {m.var for m in members}
    inputs: list[Var] = []
    for m in members:
        for a in m.value.args:
            if isinstance(a, (Var, Constant)) and a not in defined and a not in inputs:
                inputs.append(a)
    params = [Var(getattr(v, "name", "const"), v.ann) for v in inputs]
    remap: dict[Var, Expr] = dict(zip(inputs, params))
    body = []
    for m in members:
        call = m.value
        args = tuple(remap.get(a, a) if isinstance(a, (Var, Constant)) else a for a in call.args)
        nv = Var(m.var.name, m.var.ann, dataflow=True)
        body.append(Binding(nv, CallTIR(call.program, args, call.out_ann, call.sym_args)))
        remap[m.var] = nv
    params = _with_shape_param(params, body)
    result = remap[members[-1].var]
    name = "fused_" + "_".join(_short(m.value.program) for m in members)
    base, i = name, 1
    while name in mod.functions:
        name, i = f"{base}{i}", i + 1
    mod.functions[name] = Function(name, tuple(params), SeqExpr((BindingBlock(tuple(body), True),), result),
                                   result.ann, {"primitive": True}, fn.bounds)
    args: list[Expr] = list(inputs)
    if len(params) > len(inputs):  # the extra shape parameter: its variables, in the caller's terms
        args.append(ShapeExpr(params[-1].ann.values))
    last = members[-1].var
    return Binding(last, CallFunc(name, tuple(args), last.ann))


def _with_shape_param(params: list[Var], body: list[Binding]) -> list[Var]:
    """The extra Shape parameter must also carry variables that only the members' sym_args or
    result shapes use (an arange's start, say), not just those of the parameter annotations."""
    params = with_shape_param(params)
    shape = params[-1] if params and isinstance(params[-1].ann, A.ShapeAnn) else None
    defined = set().union(*(_param_defined_syms(p.ann) for p in params))
    needed: list = []
    for b in body:
        for e in tuple(b.value.sym_args) + tuple(b.value.out_ann.shape or ()):
            for v in sorted(e.free_vars(), key=lambda v: v.name):
                if v not in defined and v not in needed:
                    needed.append(v)
    if not needed:
        return params
    values = tuple(shape.ann.values) if shape is not None else ()
    values += tuple(sym.as_expr(v) for v in needed)
    base = params[:-1] if shape is not None else params
    return base + [Var("shape_args", A.Shape(values))]


def _short(program: str) -> str:
    return program.rstrip("0123456789") or program

