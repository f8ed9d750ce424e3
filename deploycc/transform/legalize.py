"""legalize: replace every high-level op call with a call_tir of its tensor program.

Runtime builtins (ops with no legalization, such as the KV-cache calls) stay as they are.
"""
from __future__ import annotations

from ..ir import op as op_registry
from ..ir.expr import Binding, BindingBlock, Call, Function, MatchCast, SeqExpr, with_body
from ..ir.module import IRModule


def legalize(mod: IRModule) -> IRModule:
    out = mod.with_functions(mod.functions)
    out.attrs.pop("_program_text", None)
    for name, fn in mod.graph_functions().items():
        out.functions[name] = _legalize_function(fn, out)
    return out


def _legalize_function(fn: Function, mod: IRModule) -> Function:
    blocks = []
    for block in fn.body.blocks:
        bindings = []
        for b in block.bindings:
            value = b.value
            if isinstance(value, Call):
                rule = op_registry.get(value.op).legalize
                if rule is not None:
                    value = rule(value, mod)
            bindings.append(MatchCast(b.var, value, b.ann) if isinstance(b, MatchCast) else Binding(b.var, value))
        blocks.append(BindingBlock(tuple(bindings), block.dataflow))
    return with_body(fn, SeqExpr(tuple(blocks), fn.body.result))
