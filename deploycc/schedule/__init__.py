"""schedule: turn every tensor program into kernels for a target, by an ordered list of rules.

Each rule looks at a (fused) program and returns a Schedule or None; the first that applies wins
(TVM dlight's `_apply_rules`). The fallback always applies. On a target whose kernels have vector types, the
chosen schedule's lane loops then become explicit vectors (vectorize.py).
"""
from __future__ import annotations

from ..ir.kernel import Kernel, Schedule, scheduled
from ..ir.module import IRModule
from ..ir.tir import TensorProgram
from . import attention, attention_append, dispatch, dp4a, fallback, gemv, matmul, mma, qgemv, row, row_block
from .vectorize import vectorize

RULES = (attention.rule, attention_append.rule, qgemv.rule, dp4a.rule, dp4a.rounding, dispatch.rule, mma.codes_rule,
         mma.rule, matmul.rule, gemv.rule, row_block.rule, row.rule, fallback.rule)


def schedule_program(prog: TensorProgram, target, rules=RULES) -> TensorProgram:
    for r in rules:
        s = r(prog, target)
        if s is not None:
            if "activations" in prog.attrs and not qgemv.is_integer(s):
                # the program multiplies rounded activations (transform/absorb_rounding.py): a float kernel would
                # compute something else than the graph says
                raise ValueError(f"{prog.name} reads activations rounded to {prog.attrs['activations']} bits, but "
                                 f"no integer schedule takes it (the {s.rule} rule did); this is a bug")
            if getattr(target, "vector_lanes", False):
                s = vectorize(s)
            return TensorProgram(prog.name, prog.params, prog.body, prog.sym_params, prog.num_outputs,
                                 {**prog.attrs, "schedule": s})
    raise ValueError(f"no schedule rule applies to {prog.name}")


def schedule(mod: IRModule, target) -> IRModule:
    out = mod.with_functions(mod.functions)
    for name, prog in mod.programs().items():
        out.functions[name] = schedule_program(prog, target)
    return out


__all__ = ["RULES", "Kernel", "Schedule", "schedule", "schedule_program", "scheduled"]
