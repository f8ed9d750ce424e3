"""The compilation pipeline: one flat, named list of passes; the IR can be printed after any stage.

    exported    Model.export: graph functions of high-level op calls
    legalized   absorb_rounding (integer cpu targets), merge_matmuls, legalize: op calls -> call_tir of tensor
                programs
    fused       annotate_patterns, fuse_ops, fuse_tensor (+ dead code elimination)
    scheduled   schedule: each program -> kernels for the target (rules in deploycc.schedule)
    vm          plan_memory (per graph function, seq_len up to the prefill chunk) and lower_vm: the bytecode,
                kernels, constants and storages a package is written from (compile(); package.py writes them)
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import DeployError
from .ir import sym
from .ir.expr import CallTIR, Function, If
from .ir.kernel import scheduled
from .ir.module import IRModule
from .schedule import dp4a, schedule, schedule_program
from .transform import legalize
from .transform.absorb_rounding import absorb_rounding
from .transform.annotate_patterns import annotate_patterns
from .transform.fuse_ops import fuse_ops
from .transform.fuse_tensor import fuse_tensor
from .transform.inline_prologue import inline_prologues
from .transform.merge_matmuls import merge_matmuls
from .transform.plan_memory import plan_memory
from .vm import kv_attend, lower_vm
from .vm.kv_fuse import sink_producers

STAGES = ("exported", "legalized", "fused", "scheduled")
STOPS = (*STAGES, "vm")  # where compile() may stop


@dataclass
class Compiled:
    """What compile() reached: the module after its last stage; at "vm" also each graph function's memory plan
    and the lowered program (vm/lower.py Lowered: bytecode, kernels, constants, storages)."""
    stage: str
    module: IRModule
    plans: dict | None = None
    lowered: Any = None


def passes(target, fuse: bool = True) -> list[tuple[str, Callable[[IRModule], IRModule]]]:
    """(stage reached, pass) in order; one list per target (the target is a parameter, not a global).
    fuse=False: neither the merge of parallel linears nor fusion (kernel_report's "before")."""
    absorb = None
    if target is not None and target.integer_kernels:  # cuda: only what the dp4a GEMV takes (schedule/dp4a.py)
        absorb = absorb_rounding if target.core_loops else \
            (lambda m: absorb_rounding(m, lambda rows, k, bits: dp4a.takes(rows or 0, k, bits, target)))
    first = [absorb] if absorb else []
    first += [merge_matmuls] if fuse else []

    def legalized(m: IRModule) -> IRModule:
        for p in first:
            m = p(m)
        return legalize(m)
    def fused(m: IRModule) -> IRModule:
        gpu = target is not None and target.workgroup_gemv
        # on the GPU presets a gather's relabeled input is inlined too: the server's step took its last tokens' hidden
        # states through a copy of every token's and normed them one thread a row (the CPU presets' kernels unchanged)
        m = fuse_tensor(fuse_ops(annotate_patterns(m)), gathers=gpu)
        if not gpu:
            return m
        return inline_prologues(m, lambda prog: _folds_norm(prog, target))

    return [
        ("legalized", legalized),
        ("fused", fused),
        ("scheduled", lambda m: schedule(m, target)),
    ]


def _folds_norm(prog, target) -> bool:
    """Whether the schedule of a decode GEMV with a norm folded in is the GEMV's that accumulates the norm's sum
    (schedule/gemv.py), not a slower rule that would take the program all the same."""
    return schedule_program(prog, target).attrs["schedule"].rule.startswith("gemv-norm")


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


def function_bounds(fn: Function, prefill_chunk: int) -> sym.Bounds:
    """fn's declared bounds, with seq_len (a step's token count) at most the prefill chunk."""
    b = sym.Bounds(dict(fn.bounds.lower), dict(fn.bounds.upper))
    for p in fn.params:
        for v in p.ann.free_vars():
            if v.name == "seq_len":
                b.declare(v, lo=1, hi=prefill_chunk)
    return b


def compile(exported: IRModule, target, prefill_chunk: int | None = None, stop_after: str = "vm") -> Compiled:
    """The compiler: exported module -> the stage `stop_after` (one of STOPS). A package is compile(...) to "vm"
    of the export package.prepare makes; `deploycc inspect --device` stops the very same run earlier."""
    if stop_after not in STOPS:
        raise DeployError(f"unknown stage {stop_after!r}; choose one of {', '.join(STOPS)}")
    if stop_after != "vm":
        return Compiled(stop_after, run(exported, target, stop_after))
    if target is None or prefill_chunk is None:
        raise DeployError("the vm stage needs a device preset (--device)")
    mod = run(exported, target, "scheduled")
    fnames = ("prefill", "prefill_all", "decode") + tuple(f for f in ("step", "step_all", "step_one")
                                                          if f in exported.functions)
    if target.workgroup_gemv:  # kv.append's producers next to it, to join it in one launch (vm/kv_fuse.py)
        mod = sink_producers(mod, fnames)
    bounds = {f: function_bounds(mod[f], prefill_chunk) for f in fnames}
    # a decode step's attention may read what the rope-and-append before it reads (vm/kv_attend.py)
    reads = {f: kv_attend.reads(mod[f], mod, target) if target.workgroup_gemv else {} for f in fnames}
    plans = {f: plan_memory(mod[f], mod, {"seq_len": prefill_chunk}, reads[f]) for f in fnames}
    return Compiled("vm", mod, plans, lower_vm(mod, plans, target, bounds, fnames))


def launches(mod: IRModule, fn: str = "decode") -> list[tuple[str, int]]:
    """(program, kernels it launches) for each call_tir of `fn`, in order."""
    out = []

    def visit(body):
        for block in body.blocks:
            for b in block.bindings:
                v = b.value
                if isinstance(v, CallTIR):
                    s = scheduled(mod[v.program])
                    out.append((v.program, 1 if s is None or s.dispatched else len(s.kernels)))
                elif isinstance(v, If):
                    visit(v.then_branch)
                    visit(v.else_branch)
    f = mod[fn]
    assert isinstance(f, Function)
    visit(f.body)
    return out


def kernel_report(exported: IRModule, target, compiled: Compiled | None = None) -> dict:
    """Kernels of the scheduled module with their pattern kinds and launches per decode step, and
    the decode launch count with and without fusion (None on an integer cpu target: its linears exist only fused
    with their weights' dequantize, which the integer kernels tensorize). With `compiled` (compile() to "vm" of
    the same export): the package's kernels, the VM's own (the KV cache's copies) included, and the launches
    its decode bytecode makes."""
    fused = compiled.module if compiled is not None else run(exported, target, "scheduled")
    integer = target.integer_kernels
    unfused = None if integer else run(exported, target, "scheduled", fuse=False)
    per_program: dict[str, int] = {}
    for prog, _n in launches(fused):
        per_program[prog] = per_program.get(prog, 0) + 1
    kernels = []
    for name, prog in fused.programs().items():
        s = scheduled(prog)
        for k in s.kernels:
            kernels.append({"name": k.name, "program": name, "pattern": prog.attrs.get("pattern", "?"),
                            "rule": s.rule, "launches_per_decode": per_program.get(name, 0)})
    decode = sum(n for _, n in launches(fused))
    if compiled is not None:
        shipped = compiled.lowered.kernels
        counts: dict[str, int] = {}
        for ins in compiled.lowered.bytecode["functions"]["decode"]["instructions"]:
            if ins.get("fn") == "vm.launch":
                counts[ins["args"][0]["k"]] = counts.get(ins["args"][0]["k"], 0) + 1
        listed = {k["name"] for k in kernels}
        kernels = [k for k in kernels if k["name"] in shipped] + [
            {"name": n, "program": None, "pattern": "vm", "rule": "kv cache"} for n in shipped if n not in listed]
        for k in kernels:
            k["launches_per_decode"] = counts.get(k["name"], 0)
        decode = sum(counts.values())
    return {
        "kernels": kernels,
        "decode_launches": decode,
        "decode_launches_unfused": None if unfused is None else sum(n for _, n in launches(unfused)),
        "layers": exported.attrs.get("num_layers"),
    }
