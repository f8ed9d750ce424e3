"""The compilation pipeline: one flat, named list of passes; the IR can be printed after any stage.

    exported    Model.export: graph functions of high-level op calls
    legalized   absorb_rounding (integer cpu targets), merge_matmuls, legalize: op calls -> call_tir of tensor
                programs
    fused       annotate_patterns, fuse_ops, fuse_tensor (+ dead code elimination)
    scheduled   schedule: each program -> kernels for the target (rules in deploycc.schedule)
"""
from __future__ import annotations

from collections.abc import Callable

from .errors import DeployError
from .ir.expr import CallTIR, Function, If
from .ir.kernel import scheduled
from .ir.module import IRModule
from .schedule import schedule
from .transform import legalize
from .transform.absorb_rounding import absorb_rounding
from .transform.annotate_patterns import annotate_patterns
from .transform.fuse_ops import fuse_ops
from .transform.fuse_tensor import fuse_tensor
from .transform.merge_matmuls import merge_matmuls

STAGES = ("exported", "legalized", "fused", "scheduled")


def passes(target, fuse: bool = True) -> list[tuple[str, Callable[[IRModule], IRModule]]]:
    """(stage reached, pass) in order; one list per target (the target is a parameter, not a global).
    fuse=False: neither the merge of parallel linears nor fusion (kernel_report's "before")."""
    absorb = absorb_rounding if target is not None and target.kind == "cpu" and target.integer_matmuls else None
    first = [absorb] if absorb else []
    first += [merge_matmuls] if fuse else []

    def legalized(m: IRModule) -> IRModule:
        for p in first:
            m = p(m)
        return legalize(m)
    return [
        ("legalized", legalized),
        ("fused", lambda m: fuse_tensor(fuse_ops(annotate_patterns(m)))),
        ("scheduled", lambda m: schedule(m, target)),
    ]


def run(mod: IRModule, target=None, stop_after: str = "scheduled", fuse: bool = True) -> IRModule:
    if stop_after not in STAGES:
        raise DeployError(f"unknown stage {stop_after!r}; choose one of {', '.join(STAGES)}")
    if stop_after == "exported":
        return mod
    if target is None and stop_after == "scheduled":
        raise DeployError("the scheduled stage needs a device preset (--device)")
    for stage, p in passes(target, fuse):
        if stage == "fused" and not fuse:
            continue
        mod = p(mod)
        if stage == stop_after:
            break
    return mod


def launches(mod: IRModule, fn: str = "decode") -> list[tuple[str, int]]:
    """(program, kernels it launches) for each call_tir of `fn`, in order."""
    out = []

    def visit(body):
        for block in body.blocks:
            for b in block.bindings:
                v = b.value
                if isinstance(v, CallTIR):
                    s = scheduled(mod[v.program])
                    out.append((v.program, len(s.kernels) if s else 1))
                elif isinstance(v, If):
                    visit(v.then_branch)
                    visit(v.else_branch)
    f = mod[fn]
    assert isinstance(f, Function)
    visit(f.body)
    return out


def kernel_report(exported: IRModule, target) -> dict:
    """Kernels of the scheduled module with their pattern kinds and launches per decode step, and
    the decode launch count with and without fusion."""
    fused = run(exported, target, "scheduled")
    unfused = run(exported, target, "scheduled", fuse=False)
    per_program: dict[str, int] = {}
    for prog, _n in launches(fused):
        per_program[prog] = per_program.get(prog, 0) + 1
    kernels = []
    for name, prog in fused.programs().items():
        s = scheduled(prog)
        for k in s.kernels:
            kernels.append({"name": k.name, "program": name, "pattern": prog.attrs.get("pattern", "?"),
                            "rule": s.rule, "launches_per_decode": per_program.get(name, 0)})
    return {
        "kernels": kernels,
        "decode_launches": sum(n for _, n in launches(fused)),
        "decode_launches_unfused": sum(n for _, n in launches(unfused)),
        "layers": exported.attrs.get("num_layers"),
    }
