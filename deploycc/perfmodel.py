"""A performance model of a GPU package's steps, for machines without the GPU (`deploycc inspect PKG --kernels`).

Every launch of a decode step (one token after `context` tokens) and of a prefill step (`prefill` tokens) is found by
running the package's bytecode on shapes alone (runtime/dryrun.py): its kernel, blocks x threads, and buffers. Per
launch:

  bytes     the bytes of its buffers: weights and activations whole (an embedding lookup: its rows), the KV
            cache's rows the step reads (every cached row) or writes (this step's rows), and in a batched step the
            page pool's rows the sequences' page tables name; each launch reads its inputs from memory (no L2 reuse
            counted). A buffer is charged no more than the elements its loop-level program loads and stores in
            all (the final norm of a prefill reads the last row of the hidden states, not all of them)
  FLOPs     the floating-point operations of its loop-level program (kernels/programs.json), each +, -, *, /, min,
            max and function counted once over every iteration, for the launch's sizes; a program's FLOPs go to its
            last kernel (the others prepare its inputs)
  registers per thread and shared memory per block, from ptxas -v (where the CUDA toolkit is installed)
  occupancy the blocks a multiprocessor holds (limited by its threads, registers, shared memory and block slots),
            as a fraction of its threads; resident threads: min(blocks, SMs x blocks per SM) x threads
  time      a roofline with occupancy's effect: max(bytes / bandwidth, bytes / (resident threads x IN_FLIGHT) x
            LATENCY_US, FLOPs / peak) + LAUNCH_US, the peak fp32's (for the decode GEMVs, whose instructions a FLOP
            were counted in their SASS, "issue": the instructions they issue, INSTRUCTIONS_PER_FLOP, at the fp32
            peak's rate of instructions, of which they reach ISSUE_EFFICIENCY), or for a kernel on the
            tensor cores (schedule/mma.py) its matmul's multiply-adds at its tensor peak (tf32's over the
            TF32_PRODUCTS products a float multiply-add takes in 3xTF32, fp16's over the CODES_PRODUCTS of a 4- or
            8-bit weight's codes, THREE_PRODUCTS with a minimum or of fp16 weights) and, beside them, the instructions its tiles
            issue (TENSOR_INSTRUCTIONS_PER_MAC, counted in their SASS, at that same rate of instructions). The
            middle term is Little's
            law: a thread keeps IN_FLIGHT bytes of loads waiting on memory at a time (the kernels load 4-byte scalars,
            about two at once), so few resident threads cannot stream at the bandwidth however few bytes they read
            (a decode attention over 9 heads: 9 blocks). Its two constants were fitted on an H100 (docs/gpu.md:
            attention 30 us at 256 keys, about 180 at 2048). A kernel whose schedule loads a batch into registers
            before storing any (schedule/lowering.py: batched_copy) keeps that batch's bytes in flight instead
            (programs.json's "in_flight": ir/kernel.py loads_in_flight; the decode attention's 128, which an H200
            measured at 9.3 us a layer of SmolLM2's shape where IN_FLIGHT said 25). And "serial": the waves of
            blocks x the barriers a thread passes x PHASE_US, a block's steps one after another, each waiting on its
            loads (fitted on an H200's tensor-core tiles at a few rows, which no other term explained). A kernel
            whose last block to arrive finishes the work (CUDA's split decode attention combining its S partials,
            schedule/attention.py) adds that block's round trips to memory after the rest: ARRIVAL_TRIPS (its fences
            and the atomic add, and its two barriers' waits, which the serial term then leaves out) and its
            combine's (programs.json's "tail": S over the partials a trip), LATENCY_US each (not yet measured on a
            GPU). The host's
            time to enqueue the step's launches (HOST_US each, measured there with the Python VM and CuPy; for the
            decode step, run as a CUDA graph, GRAPH_HOST_US + GRAPH_INT_US per int argument + GRAPH_LAUNCH_US) runs
            beside the device's; a step takes the longer of the two.

The batched step (the server's, `predict(..., sequences=(1, 16))`) is modelled alike, one token for each sequence
after `context`; one sequence's runs the package's step_one where it has one (the CUDA presets'), as the engine
does. A decode step's predicted tokens per second is 1 / its time, and its fraction of the HBM roofline is the bytes
it must move over the bandwidth, divided by that time. Prefill: tokens / the step's time.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from .errors import DeployError
from .runtime.dryrun import _DryRun
from .runtime.engine import GRAPH_FUNCTIONS
from .runtime.symexpr import compile_expr
from .runtime.validate import DTYPE_BYTES, nbytes

LAUNCH_US = 3.0  # a kernel's least time on the GPU, back to back in a stream (launch and drain)
HOST_US = 9.0  # the host's time per launch: Python VM + CuPy, measured on an H100 (3.57 ms / 394 launches)
# a step run as a CUDA graph (runtime/graphs.py; the decode step): the VM binds the shapes and evaluates the graph's int
# arguments, then one graph launch. GRAPH_HOST_US + GRAPH_INT_US per int argument: the VM's part measured on a 2-vCPU
# Xeon (Sapphire Rapids kind) without the launch (SmolLM2-135M-shaped h100, 30 layers: docs/gpu.md); the graph launch's
# own host time (cudaGraphLaunch) is taken as GRAPH_LAUNCH_US, not measured
GRAPH_HOST_US = 10.5
GRAPH_INT_US = 0.22
GRAPH_LAUNCH_US = 10.0
LATENCY_US = 0.5  # a load's round trip to device memory
# a block's barrier, with the loads of its step before it: the tensor-core tiles at a few rows (the h100 server's step
# of 16 sequences, SmolLM2's shape: 18 and 48 K steps of two barriers, 44-54 and 105 us a launch on an H200,
# 2026-11-28, less the profile's ~5 us) took 1.0-1.2 us a barrier, whatever their bytes
PHASE_US = 1.05
# a kernel whose last block to arrive combines (schedule/attention.py): the arrival's round trips, a fence (the block's
# stores seen by the device), the atomic add and a fence again, between its two barriers (ARRIVAL_BARRIERS, left out
# of the serial term); the combine's own trips after them are the kernel's (programs.json "tail": its S partials a
# batch of 8 a trip, whose loads nvcc's SASS for sm_90 issues together before the first update)
ARRIVAL_TRIPS = 3
ARRIVAL_BARRIERS = 2
IN_FLIGHT = 8  # bytes of loads a thread has waiting at once
TF32_PRODUCTS = 3  # tensor-core products a float multiply-add takes (schedule/mma.py: 3xTF32)
CODES_PRODUCTS = 2  # and a multiply-add of 4- or 8-bit weights' codes (mma.codes_rule: x in bfloat16 and half parts)
# and of codes with a minimum (q4f16_2, Q4_1, Q4_K: the sums of x, x times ones, a third more), or of fp16 weights
# (q0f16: a half weight in a bfloat16 part and its exact rest, times x's bfloat16 part, and itself times x's half one)
THREE_PRODUCTS = 3
# The tensor-core tiles' instructions a multiply-add of their matmul, by kind, counted in the SASS nvcc makes for sm_90
# (benchmarks/tiles_sass.py, Llama-3.2-1B's widths, q4f16_1): over its 32 x 32 outputs a warp's K step of 32 (32,768
# multiply-adds) issues 1,189 instructions in the 3xTF32 tiles (4 trips of the 210-instruction loop of 8 of K and the
# staging's 349), and its K step of 64 in the codes' tiles 774 (809 before 2026-11-29's aligned pointers let nvcc
# load a thread's staged x as 16-byte vectors; with three products, q4f16_2's or q0f16's, a K step of 32 464 and 463);
# a thread of the warp issues each. Both issue more
# than their tensor cores take: the SMs' issue rate bounds them. (The tiles' time is counted in their matmul's
# multiply-adds, not in the program's FLOPs: a 4-bit weight's program has 4 a multiply-add, its dequantization's two
# among them.)
# The prefill attention's tiles on the tensor cores (schedule/attention_mma.py: QK^T and PV, each two half products,
# the softmax between them on the SIMT cores) counted the same way: a warp's key tile of 32 issues 917 instructions
# for its 16 x 32 x 64 x 2 multiply-adds at head_dim 64 (4 warps a block) and 2,533 for 16 x 32 x 128 x 2 at 128 (2
# warps: the staging's loop of 390 four times); the larger is taken.
TENSOR_INSTRUCTIONS_PER_MAC = {"tf32": 32 * 1189 / 32768, "codes": 32 * 774 / 65536, "codes3": 32 * 464 / 32768,
                               "attention": 32 * 2533 / 131072}
# Instructions a FLOP of the loop-level program costs, by schedule rule: the fp32 peak's half (a multiply-add is two
# FLOPs and one instruction) unless counted. The decode GEMVs were counted in the SASS nvcc makes for sm_90
# (benchmarks/gemv_sass.py, an 8B Llama's widths, q4f16_1, whose program has 4 FLOPs a weight): the float GEMV
# (schedule/gemv.py) 5.25 instructions a weight (shift, mask, int-to-float, the multiply-add; since 2026-11-28 the
# group's scale and the codes' zero point once a lane's 8 inputs: 8.0 before; since 2026-11-29 a lane's 8 inputs in
# two 16-byte loads, targets/cuda.py's aligned pointers: 5.50 before), the dp4a GEMV (schedule/dp4a.py) 3.0 with its
# rounding of x. So on an H100 the float GEMV cannot stream the weights at the HBM's bandwidth: its SMs
# issue 33.4 T instructions a second, 6.1 T weights. The GEMV with an RMS norm folded in (transform/inline_prologue.py:
# "gemv-norm") 5.94 a weight (each input also times its norm weight and its square summed, shared by a lane's four
# rows; 6.53 with scalar loads); its program has 9 FLOPs a weight, the norm's factor rsqrt(sum / K + eps) written
# inside the sum over K, which the kernel takes once a row.
INSTRUCTIONS_PER_FLOP = {"gemv": 5.25 / 4, "gemv-norm": 5.94 / 9, "gemv-dp4a": 0.75}
# the share of the fp32 peak's instruction rate those GEMVs issue at: Llama-3.2-1B's head (262.7 M weights, 8.0
# instructions each) took 107.7 us on an H200 (2026-11-28; 62.8 at the peak's rate), SmolLM2's (28.3 M) 18.7
ISSUE_EFFICIENCY = 0.6
FMA_INSTRUCTIONS_PER_FLOP = 0.5
FLOAT_OPS = {"add", "sub", "mul", "div", "max", "min", "neg", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid",
             "sin", "cos", "abs", "erf", "rint", "pow", "fma"}


def _sym(e, env: dict) -> int:
    """A symbolic size (runtime/symexpr.py's form) for the sizes in `env`."""
    names = list(env)
    return compile_expr(e, names.index)([env[k] for k in names])


def _value_ops(v) -> int:
    """Float operations in one evaluation of a value (loop-level JSON form: runtime/loopir.py)."""
    if not isinstance(v, list) or not v:
        return 0
    head = v[0]
    if head in ("const", "index"):
        return 0
    if head == "load":
        return sum(_value_ops(i["v"]) for i in v[2] if isinstance(i, dict))
    if head == "cast":
        return _value_ops(v[2])
    if head == "select":
        return sum(_value_ops(x) for x in v[3:])
    own = 1 if head in FLOAT_OPS and isinstance(v[1], str) and v[1].startswith("float") else 0
    return own + sum(_value_ops(x) for x in v[2:])


def program_flops(stmt, env: dict) -> int:
    """Float operations of a statement for the sizes in `env` (both branches of an `if`: an upper bound)."""
    head = stmt[0]
    if head == "seq":
        return sum(program_flops(s, env) for s in stmt[1])
    if head == "block":
        n = math.prod(_sym(it[1], env) for it in stmt[2])
        return n * _value_ops(stmt[3][3])
    if head == "store":
        return _value_ops(stmt[3])
    if head == "for":
        return _sym(stmt[2], env) * program_flops(stmt[3], env)
    if head == "alloc":
        return program_flops(stmt[2], env)
    if head == "if":
        return sum(program_flops(s, env) for s in stmt[2:] if s is not None)
    return 0


def program_macs(stmt, env: dict) -> int:
    """The iterations of a program's first block, for the sizes in `env`: a prefill matmul's multiply-adds (the
    tensor-core tiles take programs whose first block is their matmul: schedule/matmul.py prefill_matmul)."""
    head = stmt[0]
    if head == "block":
        return math.prod(_sym(it[1], env) for it in stmt[2])
    for inner in (stmt[1] if head == "seq" else [stmt[2]] if head == "alloc" else []):
        found = program_macs(inner, env)
        if found:
            return found
    return 0


def _value_accesses(v, out: dict, times: int) -> None:
    """Add `times` x the loads of a value (loop-level JSON form), by buffer, to out."""
    if not isinstance(v, list) or not v:
        return
    head = v[0]
    if head in ("const", "index"):
        return
    if head == "load":
        out[v[1]] = out.get(v[1], 0) + times
        for i in v[2]:
            if isinstance(i, dict):
                _value_accesses(i["v"], out, times)
        return
    for x in v[1:]:
        _value_accesses(x, out, times)


def program_accesses(stmt, env: dict, out: dict | None = None, times: int = 1) -> dict:
    """{buffer index: the element loads and stores of a statement} for the sizes in `env` (both branches of an `if`:
    an upper bound)."""
    out = {} if out is None else out
    head = stmt[0]
    if head == "seq":
        for s in stmt[1]:
            program_accesses(s, env, out, times)
    elif head == "block":
        program_accesses(stmt[3], env, out, times * math.prod(_sym(it[1], env) for it in stmt[2]))
    elif head == "store":
        out[stmt[1]] = out.get(stmt[1], 0) + times
        _value_accesses(stmt[3], out, times)
        for i in stmt[2]:
            if isinstance(i, dict):
                _value_accesses(i["v"], out, times)
    elif head == "for":
        program_accesses(stmt[3], env, out, times * _sym(stmt[2], env))
    elif head == "alloc":
        program_accesses(stmt[2], env, out, times)
    elif head == "if":
        for s in stmt[2:]:
            if s is not None:
                program_accesses(s, env, out, times)
    return out


@dataclass
class Launch:
    kernel: str
    blocks: int
    threads: int
    bytes: int
    flops: int = 0
    weight_bytes: int = 0
    buffers: list = field(default_factory=list)  # (bytes, whether a weight, whether KV cache rows) per argument
    registers: int | None = None
    shared: int | None = None
    tensor: str = ""  # multiplies on the tensor cores: "tf32" (three products a multiply-add), "codes" (two), "codes3"
    macs: int = 0  # the multiply-adds of its program's matmul (the tensor-core tiles': program_macs)
    barriers: int = 0  # a thread's barriers (programs.json: ir/kernel.py barriers)
    in_flight: int = IN_FLIGHT  # bytes of loads a thread has waiting at once (programs.json: ir/kernel.py loads_in_flight)
    tail: int = 0  # its last block's round trips after the others arrived (programs.json's "tail"), or 0
    rule: str = ""  # its program's schedule rule (programs.json)
    occupancy: float = 0.0  # of a multiprocessor's threads
    filled: float = 0.0  # of the whole GPU's threads
    seconds: float = 0.0
    bound: str = ""


@dataclass
class StepPrediction:
    function: str
    tokens: int
    context: int
    launches: list = field(default_factory=list)
    graph: bool = False  # run as a CUDA graph (runtime/graphs.py)
    int_args: int = 0  # its launches' int arguments

    @property
    def device_s(self) -> float:
        return sum(x.seconds for x in self.launches)

    @property
    def host_s(self) -> float:
        if self.graph:
            return (GRAPH_HOST_US + GRAPH_INT_US * self.int_args + GRAPH_LAUNCH_US) * 1e-6
        return len(self.launches) * HOST_US * 1e-6

    @property
    def seconds(self) -> float:
        return max(self.device_s, self.host_s)

    @property
    def bytes(self) -> int:
        return sum(x.bytes for x in self.launches)

    @property
    def flops(self) -> int:
        return sum(x.flops for x in self.launches)


class _Recorder(_DryRun):
    """The dry run of one step, keeping every launch's kernel, blocks and buffer bytes."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.launches: list[Launch] = []
        self.ints: list[dict] = []  # each launch's int arguments by name (the program's sizes)
        self.int_args = 0  # the int arguments of the step's launches (a graph's table: runtime/graphs.py)

    def vm_launch(self, w: str, args: list) -> None:
        super().vm_launch(w, args)
        name = args[0]["k"]
        entry = self.m["kernels"]["entries"][name]
        sig = entry["args"]
        sep = next(i for i, a in enumerate(args) if a.get("str") == "|")
        ints = dict(zip(sig["scalars"], (self.ev(a["s"]) for a in args[sep + 1:])))
        if self.ev(args[1]["s"]):  # launched: the VM skips a launch of no work-groups
            self.int_args += len(args) - sep - 1
        parts = []
        kv = self.m["kv_cache"]
        for a, decl in zip(args[3:sep], sig["buffers"]):
            if "kv" in a:  # the rows this step touches: written, this step's; read, every cached one
                rows = self.s if decl["written"] else self.length
                parts.append((nbytes((rows, kv["kv_heads"], kv["head_dim"]), kv["dtype"]), False, True))
                continue
            b = self.reg(a, w, "tensor")
            size = nbytes(b.shape, b.dtype)
            if b.home == "cache" and self.batch and b.shape:  # a page pool: the rows the step's page tables name
                rows = self.s if decl["written"] else self.batch[0] * self.batch[1] * kv["pool"]["page_size"]
                size = size * min(rows, b.shape[0]) // b.shape[0]
            if "take" in name and b.home == "weight" and b.shape:  # a lookup reads one row per token, not the table
                size = size * min(self.s * (self.batch[0] if self.batch else 1), b.shape[0]) // b.shape[0]
            parts.append((size, b.home == "weight", False))
        groups = self.ev(args[1]["s"])
        if groups == 0:  # not launched (the VM skips it): a dispatched alternative for other shapes
            return
        self.launches.append(Launch(name, groups, entry["threads"], sum(x[0] for x in parts),
                                    weight_bytes=sum(x[0] for x in parts if x[1]), buffers=parts))
        self.ints.append(ints)


def _registers(pkg: Path, manifest: dict) -> dict:
    """{kernel: (registers per thread, shared bytes per block)} from ptxas -v, or {} without the CUDA toolkit."""
    from .runtime.devices.base import DeviceError
    from .runtime.devices.cuda import compile_cuda, ptxas_check

    arch = manifest["target"].get("arch") or "sm_90"
    files = {e["file"] for e in manifest["kernels"]["entries"].values()}
    out = {}
    try:
        for f in sorted(files):
            usage = ptxas_check(compile_cuda((pkg / f).read_text(), arch), arch)
            out.update({k: (u["registers"], u["shared_bytes"]) for k, u in usage.items()})
    except DeviceError:
        return {}
    return out


def _tensor_kernels(pkg: Path, manifest: dict) -> dict:
    """{kernel: "tf32", "codes" or "codes3"} of the kernels that multiply on the tensor cores, read from the CUDA C of a
    package whose programs.json predates their "tensor" (schedule/mma.py: wmma::mma_sync; the codes' tiles multiply
    bfloat16 fragments, in three products where they sum x for a minimum or split a half weight)."""
    out = {}
    for f in {e["file"] for e in manifest["kernels"]["entries"].values()}:
        parts = re.split(r'extern "C" __global__ void (\w+)\(', (pkg / f).read_text())
        out.update({name: ("codes3" if "xsum" in body or "Bs_r" in body else "codes") if "__nv_bfloat16" in body
                    else "tf32"
                    for name, body in zip(parts[1::2], parts[2::2]) if "wmma::mma_sync" in body})
    return out


def _programs(pkg: Path, manifest: dict) -> list:
    """The loop-level programs of a package (kernels/programs.json), or [] where it has none."""
    rel = manifest["kernels"].get("programs")
    return [] if rel is None else json.loads((pkg / rel).read_text())["programs"]


def _flops_by_kernel(programs: list) -> dict:
    """{the kernel of each program that does its arithmetic: the program's body}. That kernel is the last (each of a
    dispatched schedule's alternatives, of which one runs), but where the work is split over blocks (attention's
    `_part` kernel, schedule/attention.py) the blocks' kernel rather than the combine after it (the program's last
    kernel, or a page pool's `_merge`)."""
    out = {}
    for p in programs:
        ks = [k["name"] for k in p["schedule"]["kernels"]]
        parts = [k for k in ks if k.endswith("_part")]  # the split form: its combine after it does none
        if p["schedule"].get("dispatched"):
            ks = [k for k in ks if not k.endswith("_merge")]
        for k in ks if p["schedule"].get("dispatched") else parts or ks[-1:]:
            out[k] = p["body"]
    return out


def _kernel_buffers(programs: list) -> dict:
    """{kernel: (its program's body, [(buffer index in the program, bytes an element) per kernel argument])}, for the
    kernels whose arguments are all the program's own buffers."""
    out = {}
    for p in programs:
        decls = p["buffers"]
        for k in p["schedule"]["kernels"]:
            idx = k["buffers"]
            if all(isinstance(i, int) and i < len(decls) and decls[i]["dtype"] in DTYPE_BYTES for i in idx):
                out[k["name"]] = (p["body"], [(i, DTYPE_BYTES[decls[i]["dtype"]]) for i in idx])
    return out


def predict(pkg: str | Path, context: int | None = None, prefill: int | None = None,
            sequences: tuple[int, ...] = (), graphs: bool = True) -> dict:
    """The decode step after `context` tokens (default: the context window's half) and the prefill step of `prefill`
    tokens (default: the prefill chunk, at most 512) of a CUDA package, on its preset's hardware; and for each count
    in `sequences`, the batched step (the server's) of that many sequences, one token each, after `context`. graphs:
    the decode step's host time as a CUDA graph's (runtime/graphs.py), as the runtime runs it, or launch by launch
    (DEPLOYCC_CUDA_GRAPHS=0)."""
    from . import presets
    from .runtime.package import read_manifest

    pkg = Path(pkg)
    m = read_manifest(pkg)
    if m["target"]["kind"] != "cuda":
        raise DeployError(f"the performance model is for CUDA packages; {pkg} is a {m['target']['kind']} package")
    preset = presets.load(m["preset"]["name"])
    hw = preset.hardware
    if not hw:
        raise DeployError(f"preset {preset.name} states no hardware: figures (bandwidth, multiprocessors, peaks)")
    bc = json.loads((pkg / "bytecode.json").read_text())
    ctx, chunk = m["bounds"]["context_window"], m["bounds"]["prefill_chunk"]
    context = min(context or ctx // 2, ctx)
    prefill = min(prefill or min(chunk, 512), chunk, ctx)
    regs = _registers(pkg, m)
    programs = _programs(pkg, m)
    bodies = _flops_by_kernel(programs)
    accessed = _kernel_buffers(programs)
    # the tensor-core kernels' kinds as their schedules recorded them (programs.json's "tensor"); a package compiled
    # before they did is read from its CUDA C
    tensor = {k["name"]: k["tensor"] for p in programs for k in p["schedule"]["kernels"] if "tensor" in k} \
        or _tensor_kernels(pkg, m)
    rules = {k["name"]: rule for p in programs for k, rule in _kernel_rules(p["schedule"])}
    passed = {k["name"]: k["barriers"] for p in programs for k in p["schedule"]["kernels"] if "barriers" in k}
    flying = {k["name"]: k["in_flight"] for p in programs for k in p["schedule"]["kernels"] if "in_flight" in k}
    tails = {k["name"]: k["tail"] for p in programs for k in p["schedule"]["kernels"] if "tail" in k}
    steps = {}
    runs = [("decode", "decode", 1, context - 1, None), ("prefill", "prefill", prefill, 0, None)]
    if sequences and "step" in bc["functions"]:
        width = -(-context // m["kv_cache"]["pool"]["page_size"])  # each sequence's pages
        # a step of one sequence runs step_one where the package has it (runtime/engine.py: step_function)
        one = "step_one" if "step_one" in bc["functions"] else "step"
        runs += [(f"step{b}", one if b == 1 else "step", b, 0, (b, width)) for b in sequences]
    for key, fname, s, cached, batch in runs:
        rec = _Recorder(fname, bc["functions"][fname], m, s, cached, {}, batch)
        rec.run()
        step = StepPrediction(fname, s, context if batch else cached + s, graph=graphs and fname in GRAPH_FUNCTIONS,
                              int_args=rec.int_args)
        for launch, ints in zip(rec.launches, rec.ints):
            if launch.kernel in bodies:
                launch.flops = program_flops(bodies[launch.kernel], ints)
            if launch.kernel in accessed:
                _bound_by_accesses(launch, *accessed[launch.kernel], ints)
            launch.registers, launch.shared = regs.get(launch.kernel, (None, None))
            launch.tensor = tensor.get(launch.kernel, "")
            if launch.tensor and launch.kernel in bodies:  # an attention's first block is QK^T; PV as many again
                launch.macs = program_macs(bodies[launch.kernel], ints) * (2 if launch.tensor == "attention" else 1)
            launch.rule = rules.get(launch.kernel, "")
            if launch.kernel in passed:
                launch.barriers = _sym(passed[launch.kernel], ints)
            launch.in_flight = max(IN_FLIGHT, flying.get(launch.kernel, 0))
            if launch.kernel in tails:
                launch.tail = _sym(tails[launch.kernel], ints)
            _time(launch, hw)
            step.launches.append(launch)
        steps[key] = step
    return {"package": str(pkg), "preset": preset.name, "hardware": hw, "steps": steps,
            "model": {"launch_us": LAUNCH_US, "host_us": HOST_US, "latency_us": LATENCY_US, "in_flight": IN_FLIGHT,
                      "phase_us": PHASE_US, "graphs": graphs, "graph_host_us": GRAPH_HOST_US, "graph_int_us": GRAPH_INT_US,
                      "graph_launch_us": GRAPH_LAUNCH_US}}


def _kernel_rules(s: dict) -> list:
    """(kernel, its rule) of a program's schedule: a dispatched schedule's rule names each alternative's, in kernel order
    ("gemv|gemv-rows|gemv-rows|mma-codes": schedule/dispatch.py)."""
    parts = s.get("rule", "").split("|")
    if s.get("dispatched") and len(parts) == len(s["kernels"]):
        return list(zip(s["kernels"], parts))
    return [(k, s.get("rule", "")) for k in s["kernels"]]


def _bound_by_accesses(x: Launch, body, buffers: list, env: dict) -> None:
    """Each of a launch's buffers charged at most the elements its program loads and stores (KV cache rows and the
    buffers the program does not name, a schedule's workspace, as they are)."""
    try:
        count = program_accesses(body, env)
    except ValueError:  # a size the kernel is not passed (its program's other kernels take it): charged whole
        return
    parts = []
    for (size, weight, kv), (i, item) in zip(x.buffers, buffers):
        bounded = not kv and i in count  # a workspace is not the program's: charged whole
        parts.append((min(size, count[i] * item) if bounded else size, weight, kv))
    x.buffers = parts
    x.bytes = sum(p[0] for p in parts)
    x.weight_bytes = sum(p[0] for p in parts if p[1])


def _time(x: Launch, hw: dict) -> None:
    per_mp = [hw["blocks_per_multiprocessor"], hw["threads_per_multiprocessor"] // x.threads]
    if x.registers:
        per_mp.append(hw["registers_per_multiprocessor"] // (x.registers * x.threads))
    if x.shared:
        per_mp.append(hw["shared_memory_per_multiprocessor"] // x.shared)
    blocks_per_mp = max(1, min(per_mp))
    x.occupancy = blocks_per_mp * x.threads / hw["threads_per_multiprocessor"]
    resident = min(x.blocks, hw["multiprocessors"] * blocks_per_mp) * x.threads
    x.filled = resident / (hw["multiprocessors"] * hw["threads_per_multiprocessor"])
    waves = -(-x.blocks // (hw["multiprocessors"] * blocks_per_mp))
    times = {"bandwidth": x.bytes / (hw["bandwidth_gb_s"] * 1e9),
             "latency": x.bytes / max(resident, 1) / x.in_flight * LATENCY_US * 1e-6,
             "serial": waves * (x.barriers - (ARRIVAL_BARRIERS if x.tail else 0)) * PHASE_US * 1e-6,
             "arithmetic": x.flops / (hw["fp32_tflops"] * 1e12)}
    if x.tensor:  # the tensor cores' products and the tiles' instructions (counted): what the SMs issue beside them
        macs = x.macs or x.flops // 2
        times["arithmetic"] = macs / tensor_macs(x.tensor, hw)
        times["issue"] = (macs * TENSOR_INSTRUCTIONS_PER_MAC[x.tensor]
                          / (hw["fp32_tflops"] * FMA_INSTRUCTIONS_PER_FLOP * ISSUE_EFFICIENCY) / 1e12)
    elif instructions_per_flop(x.rule) != FMA_INSTRUCTIONS_PER_FLOP:  # counted: what the SMs issue
        times["issue"] = (x.flops * instructions_per_flop(x.rule)
                          / (hw["fp32_tflops"] * FMA_INSTRUCTIONS_PER_FLOP * ISSUE_EFFICIENCY) / 1e12)
        del times["arithmetic"]
    x.bound = max(times, key=times.get)
    tail = (ARRIVAL_TRIPS + x.tail) * LATENCY_US * 1e-6 if x.tail else 0.0
    x.seconds = times[x.bound] + tail + LAUNCH_US * 1e-6


# each kind of tensor-core tiles: (the peak its products run at, the products a multiply-add takes)
TENSOR_KINDS = {"tf32": ("tf32_tensor_tflops", TF32_PRODUCTS), "codes": ("fp16_tensor_tflops", CODES_PRODUCTS),
                "codes3": ("fp16_tensor_tflops", THREE_PRODUCTS), "attention": ("fp16_tensor_tflops", CODES_PRODUCTS)}


def tensor_macs(kind: str, hw: dict) -> float:
    """The matmul's multiply-adds a second of tensor-core tiles of `kind` (a multiply-add two FLOPs): its peak over the
    products a multiply-add takes (TENSOR_KINDS)."""
    peak, products = TENSOR_KINDS[kind]
    return hw[peak] * 1e12 / 2 / products


def instructions_per_flop(rule: str) -> float:
    """INSTRUCTIONS_PER_FLOP of a schedule rule (the dp4a rule's formats alike), else a multiply-add's."""
    key = ("gemv-dp4a" if rule.startswith("gemv-dp4a") else "gemv-norm" if rule.startswith("gemv-norm")
           else "gemv" if rule.startswith("gemv-split") else rule)
    return INSTRUCTIONS_PER_FLOP.get(key, FMA_INSTRUCTIONS_PER_FLOP)


def summary(pred: dict) -> dict:
    """The steps' figures: decode tok/s and its fraction of the HBM roofline, prefill tok/s, launches per step."""
    hw = pred["hardware"]
    d, p = pred["steps"]["decode"], pred["steps"]["prefill"]
    roof = d.bytes / (hw["bandwidth_gb_s"] * 1e9)
    return {"decode_tok_s": 1 / d.seconds, "decode_roofline_fraction": roof / d.seconds,
            "decode_device_ms": d.device_s * 1e3, "decode_host_ms": d.host_s * 1e3, "decode_launches": len(d.launches),
            "decode_graph": d.graph,
            "decode_bytes": d.bytes, "roofline_tok_s": 1 / roof,
            "prefill_tok_s": p.tokens / p.seconds, "prefill_tokens": p.tokens, "prefill_launches": len(p.launches),
            "prefill_tflops": p.flops / p.seconds / 1e12, "context": d.context}


def rows(step: StepPrediction) -> list[dict]:
    """One row per kernel: its launches in the step and their sums."""
    out: dict[str, dict] = {}
    for x in step.launches:
        r = out.setdefault(x.kernel, {"kernel": x.kernel, "launches": 0, "blocks": x.blocks, "threads": x.threads,
                                      "registers": x.registers, "shared_bytes": x.shared,
                                      "occupancy": round(x.occupancy, 3), "filled": round(x.filled, 3),
                                      "bytes": 0, "flops": 0, "seconds": 0.0, "bound": x.bound})
        r["launches"] += 1
        r["bytes"] += x.bytes
        r["flops"] += x.flops
        r["seconds"] += x.seconds
    return sorted(out.values(), key=lambda r: -r["seconds"])
