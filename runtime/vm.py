"""The register VM: bytecode (two opcodes, call and ret) turned into prepared calls at load time.

Every instruction becomes a Python closure with its operands resolved: kernels looked up, symbolic
expressions compiled to small functions of the shape heap, registers to indices. The per-token loop
runs the closures and touches no JSON, allocates no device memory (tensors are views of storages
allocated at load), and launches kernels straight through the device.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .symexpr import compile_expr


class VMError(RuntimeError):
    pass


@dataclass
class DTensor:
    """A tensor on the device: a buffer (a storage, a weight or a cache) and its shape."""

    buf: object
    shape: tuple
    dtype: str


# The shape variables vm.match_shape binds (deploycc/vm/lower.py), in the shape heap's slot order: a step's tokens,
# the cached positions after it, and in a batched step its sequences and the width of their page tables.
SHAPE_VARS = ("seq_len", "total_len", "batch", "pages_len")
DTYPE_BYTES = {"float32": 4, "float16": 2, "int32": 4, "uint32": 4, "int8": 1, "int16": 2, "uint8": 1}
NP = {"float32": np.float32, "float16": np.float16, "int32": np.int32, "uint32": np.uint32, "int8": np.int8,
      "int16": np.int16, "uint8": np.uint8}



@dataclass(frozen=True)
class Builtin:
    """A builtin the bytecode calls, as every part of the system knows it: its operands by kind (r register, i int,
    s symbolic expression, str string, k kernel; `more`: the kind of any further operands, a group of kinds named in
    validate_bytecode.py KINDS), whether it writes its destination register, and whether only a batched `step`
    (a page pool) calls it. The emitter (deploycc/vm/lower.py), this VM, the validator, the dry run, the C
    lowering (deploycc/vm/capture.py) and the browser runtime (web/deploycc.js, its BUILTINS: the builtins of
    one sequence's steps) implement these names and no others (tests/runtime/test_builtins.py)."""

    operands: tuple[str, ...]
    more: str | None
    writes: bool
    paged: bool = False


BUILTIN_TABLE = {
    "vm.match_shape": Builtin(("r",), "dim", False),
    "vm.alloc": Builtin(("i", "str"), "s", True),
    "vm.launch": Builtin(("k", "s", "i"), "launch", False),
    "vm.tuple": Builtin((), "r", True),
    "vm.get": Builtin(("r", "i"), None, True),
    "vm.move": Builtin(("r",), None, True),
    "kv.begin": Builtin(("r", "s"), None, True),
    "kv.view": Builtin(("r", "str", "i"), None, True),
    "kv.pages": Builtin(("r",), None, True, paged=True),
    "kv.meta": Builtin(("r", "str"), None, True, paged=True),
}
BUILTINS = tuple(BUILTIN_TABLE)
# builtin -> the VM's method (vm, args, function) -> closure (regs, heap) -> value; one per BUILTIN_TABLE entry
# (tests/runtime/test_builtins.py), as the dry run's methods (runtime/dryrun.py) and the C lowering's (vm/capture.py)
RUNS: dict[str, Callable] = {}


def _runs(name: str):
    def register(method):
        RUNS[name] = method
        return method
    return register


class Function:
    def __init__(self, name: str, spec: dict, vm: VM):
        self.name = name
        self.num_inputs = spec["num_inputs"]
        self.nregs = spec["registers"]
        self.heap_names: list[str] = []
        self.static = _static_registers(spec)
        # the work-group counts of its launch sites that depend on shapes, each distinct expression once, in order of
        # appearance (a graph's key: runtime/graphs.py); the row-count dispatch's alternatives repeat a few of them in
        # every layer (SmolLM2's h100 step: 669 sites, 25 expressions, 0.90 -> 0.03 ms a step to evaluate)
        self.symbolic_groups: dict = {}
        self.code = [vm.prepare(ins, self) for ins in spec["instructions"]]
        self.ops = [ins.get("fn", ins["op"]) for ins in spec["instructions"]]
        self.preset: dict[int, object] = {}
        self.native = None  # (prologue, epilogue, call, heap slots, int array): set by use_native
        self.graphs = None  # StepGraphs (runtime/graphs.py): set by VM.use_graphs
        self.graph_code = None  # (prologue, the rest, epilogue) of a function run as graphs: set by VM.use_graphs

    def use_native(self, info: dict, call, heap_values) -> None:
        """Run this function as one native call (deploycc/vm/capture.py): the prologue instructions in
        Python (they bind and check the shape variables), then `call()` for every launch (it reads `heap_values`),
        then the epilogue instructions that build the returned tensor."""
        ret = next(i for i, c in enumerate(self.code) if c[0] == "ret")
        epilogue = [self.code[i] for i in info["epilogue"]] + [self.code[ret]]
        slots = [self.slot(name) for name in info["heap"]]
        self.native = (self.code[:info["prologue"]], epilogue, call, slots, heap_values)

    def slot(self, name: str) -> int:
        if name not in self.heap_names:
            self.heap_names.append(name)
        return self.heap_names.index(name)


class VM:
    def __init__(self, bytecode: dict, device, kernels: dict, storages: list, kv_cache=None, max_grid: int = 65535,
                 bounds: dict[str, int] | None = None):
        """`bounds`: shape variable -> the largest value the memory plan allows (seq_len: the prefill chunk,
        total_len: the context window); vm.match_shape refuses a value outside 1..bound, so no input reaches a
        launch whose buffers the plan did not size for it."""
        self.device = device
        self.kernels = kernels
        self.storages = storages
        self.cache = kv_cache
        self.max_grid = max_grid
        self.bounds = bounds or {}
        self.launches = 0
        self.recording: list | None = None  # the launches of a step run as a CUDA graph, while it runs
        self.functions = {name: Function(name, spec, self) for name, spec in bytecode["functions"].items()}

    # ---- preparation ------------------------------------------------------------------------
    def operand(self, a: dict, fn: Function):
        """A getter (regs, heap) -> value for one operand."""
        if "r" in a:
            r = a["r"]
            return lambda regs, heap: regs[r]
        if "s" in a:
            f = compile_expr(a["s"], fn.slot)
            return lambda regs, heap: f(heap)
        if "i" in a or "str" in a:
            v = a.get("i", a.get("str"))
            return lambda regs, heap: v
        if "kv" in a:
            r, which, layer = a["kv"]
            return lambda regs, heap: (regs[r].k if which == "k" else regs[r].v)[layer]
        raise VMError(f"bad operand {a}")

    def prepare(self, ins: dict, fn: Function):
        op = ins["op"]
        if op == "ret":
            get = self.operand(ins["args"][0], fn)
            return ("ret", get)
        if op != "call":
            raise VMError(f"unknown opcode {op!r}")
        name, args, dst = ins["fn"], ins["args"], ins.get("dst")
        run = RUNS.get(name)
        if run is None:
            raise VMError(f"unknown builtin {name!r}")
        return ("call", run(self, args, fn), dst if BUILTIN_TABLE[name].writes else None)

    # ---- the builtins: each makes the closure (regs, heap) -> value of one instruction ------------
    @_runs("kv.begin")
    def _kv_begin(self, args: list, fn: Function):
        n = self.operand(args[1], fn)
        slot_cache = self.operand(args[0], fn)
        return lambda regs, heap: (slot_cache(regs, heap).begin(n(regs, heap)),)

    @_runs("kv.view")
    def _kv_view(self, args: list, fn: Function):
        cache, which, layer = (self.operand(a, fn) for a in args)
        return lambda regs, heap: cache(regs, heap).view(which(regs, heap), layer(regs, heap))

    @_runs("kv.pages")
    def _kv_pages(self, args: list, fn: Function):
        """a batched step: (sequences, page-table width) of the pool's plan"""
        cache = self.operand(args[0], fn)
        return lambda regs, heap: cache(regs, heap).pages_shape()

    @_runs("kv.meta")
    def _kv_meta(self, args: list, fn: Function):
        cache, which = (self.operand(a, fn) for a in args)
        return lambda regs, heap: cache(regs, heap).meta(which(regs, heap))

    @_runs("vm.move")
    def _move(self, args: list, fn: Function):
        return self.operand(args[0], fn)

    @_runs("vm.tuple")
    def _tuple(self, args: list, fn: Function):
        gets = [self.operand(a, fn) for a in args]
        return lambda regs, heap: tuple(g(regs, heap) for g in gets)

    @_runs("vm.get")
    def _get(self, args: list, fn: Function):
        t, i = (self.operand(a, fn) for a in args)
        return lambda regs, heap: t(regs, heap)[i(regs, heap)]

    @_runs("vm.match_shape")
    def _prep_match(self, args: list, fn: Function):
        get = self.operand(args[0], fn)
        checks = []
        for k, a in enumerate(args[1:]):
            if "bind" in a:
                checks.append((k, "bind", fn.slot(a["bind"]), a["bind"]))
            else:
                checks.append((k, "check", compile_expr(a["s"], fn.slot), None))
        bounds, vm = self.bounds, self

        def match(regs, heap):
            v = get(regs, heap)
            shape = v.shape if isinstance(v, DTensor) else v
            if len(shape) != len(checks):
                raise VMError(f"{fn.name}: expected {len(checks)} dims, got {tuple(shape)}")
            for k, kind, f, name in checks:
                if kind == "bind":
                    if name in bounds:
                        vm._check_bound(fn.name, name, shape[k])
                    heap[f] = shape[k]
                elif f(heap) != shape[k]:
                    raise VMError(f"{fn.name}: dimension {k} of {tuple(shape)} should be {f(heap)}")
        return match

    def _check_bound(self, fname: str, name: str, value: int) -> None:
        hi = self.bounds[name]
        if not 1 <= value <= hi:
            raise VMError(f"{fname}: {name} = {value} is outside 1..{hi}, the range this package's memory plan is for; "
                          f"split the input or recompile with larger bounds")
        if name == "total_len" and self.cache is not None and value != self.cache.length:
            raise VMError(f"{fname}: total_len = {value}, but the KV cache holds {self.cache.length} tokens")

    @_runs("vm.alloc")
    def _prep_alloc(self, args: list, fn: Function):
        sid, dtype = args[0]["i"], args[1]["str"]
        dims = [compile_expr(a["s"], fn.slot) for a in args[2:]]
        storage = self.storages[sid]
        return lambda regs, heap: DTensor(storage, tuple(d(heap) for d in dims), dtype)

    @_runs("vm.launch")
    def _prep_launch(self, args: list, fn: Function):
        kernel = self.kernels[args[0]["k"]]
        groups = compile_expr(args[1]["s"], fn.slot)
        if not isinstance(args[1]["s"], int):
            fn.symbolic_groups.setdefault(repr(args[1]["s"]), groups)
        threads = args[2]["i"]
        sep = next(i for i, a in enumerate(args) if a.get("str") == "|")
        bufs = [self.operand(a, fn) for a in args[3:sep]]
        scalars = [compile_expr(a["s"], fn.slot) for a in args[sep + 1:]]
        site, max_grid, vm = self.device.launcher(kernel), self.max_grid, self
        max_groups = max_grid * max_grid  # a 2-D grid of max_grid x max_grid
        block = (threads, 1, 1)
        split = getattr(kernel, "meta", {}).get("split") or {}
        if split:
            from .devices import buffer_ranges
        else:  # capture: buffers that are the same object on every run are looked up once
            dynamic = [(i, b) for i, (a, b) in enumerate(zip(args[3:sep], bufs)) if a.get("r") not in fn.static]
            consts = [s({}) if isinstance(a["s"], int) else None for a, s in zip(args[sep + 1:], scalars)]
            if all(c is not None for c in consts):
                scalars = [(lambda c: lambda heap: c)(c) for c in consts]
            captured: list = []

            def replay(regs, heap):
                g = groups(heap)
                if not 0 < g <= max_groups:
                    vm._no_groups(kernel, g, max_groups)
                    return
                grid = (g, 1, 1) if g <= max_grid else (max_grid, -(-g // max_grid), 1)
                if not captured:
                    captured.append([_buf(b(regs, heap)) for b in bufs])
                bs = captured[0]
                for i, b in dynamic:
                    bs[i] = _buf(b(regs, heap))
                if vm.recording is not None:  # a step run as a CUDA graph (runtime/graphs.py)
                    vm.recording.append((kernel, grid, block, list(bs), [s(heap) for s in scalars], scalars, site))
                else:
                    site(bs, [s(heap) for s in scalars], grid, block)
                vm.launches += 1
            return replay

        def run(regs, heap):
            g = groups(heap)
            if not 0 < g <= max_groups:
                vm._no_groups(kernel, g, max_groups)
                return
            grid = (g, 1, 1) if g <= max_grid else (max_grid, -(-g // max_grid), 1)
            bs = []
            for i, b in enumerate(bufs):
                v = b(regs, heap)
                v = v.buf if isinstance(v, DTensor) else v
                if i in split:  # a tensor bound as several ranges
                    bs += buffer_ranges(v, *split[i])
                else:
                    bs.append(v)
            site(bs, [s(heap) for s in scalars], grid, block)
            vm.launches += 1
        return run

    # instructions a function run as a CUDA graph may hold: none of them touches the device, so its launches can
    # wait for the end of the run
    GRAPH_SAFE = frozenset({"vm.match_shape", "vm.move", "vm.alloc", "vm.launch", "kv.begin", "kv.view", "kv.pages",
                            "kv.meta"})
    # the instructions that may start such a function, before any view, buffer or launch: they bind the shapes
    GRAPH_PROLOGUE = frozenset({"vm.match_shape", "vm.move", "kv.begin", "kv.pages", "kv.meta"})

    def use_graphs(self, name: str, spec: dict, limit: int = 32) -> bool:
        """Run function `name` (its bytecode `spec`) as CUDA graphs (runtime/graphs.py) where the device can capture
        them, every instruction is one of GRAPH_SAFE and every shape is bound in the prologue, before the first
        buffer; whether it does. Such a function runs as:
        - the prologue (binds and checks the shapes, begins the cache's step);
        - if a graph was captured for the inputs' buffers and the work-group counts the shapes give: the int arguments
          of its launches, evaluated from the shapes, into its table, the graph launched, and the epilogue (the
          instructions the returned value depends on). No other instruction runs;
        - else the rest of the function, its launches recorded, then captured as a graph and launched."""
        from .graphs import StepGraphs

        fn = self.functions.get(name)
        if fn is None or not hasattr(self.device, "capture") or fn.native is not None:
            return False
        if any(getattr(k, "meta", {}).get("split") for k in self.kernels.values()):
            return False  # buffers bound as several ranges (WebGPU's): launched as before
        if not set(fn.ops) - {"ret"} <= self.GRAPH_SAFE:
            return False
        ins = spec["instructions"]
        start = next(i for i, op in enumerate(fn.ops) if op not in self.GRAPH_PROLOGUE)
        if any("bind" in a for x in ins[start:] for a in x.get("args", ())):
            return False
        ret = len(ins) - 1
        if fn.ops[ret] != "ret" or "ret" in fn.ops[:ret]:
            return False
        needed, wanted = set(), {a["r"] for a in ins[ret]["args"] if "r" in a}
        for i in range(ret - 1, start - 1, -1):  # the instructions the returned value depends on
            if ins[i].get("dst") in wanted:
                needed.add(i)
                wanted |= {a["r"] for a in ins[i]["args"] if "r" in a}
        fn.graph_code = (fn.code[:start], fn.code[start:], [fn.code[i] for i in sorted(needed)] + [fn.code[ret]])
        fn.graphs = StepGraphs(self.device, name, limit)
        return True

    def _run_graphs(self, fn: Function, regs: list, heap: list):
        prologue, rest, epilogue = fn.graph_code
        _execute(prologue, regs, heap)
        key = (tuple(id(_buf(regs[i])) for i in range(fn.num_inputs)), tuple(g(heap) for g in fn.symbolic_groups.values()))
        replayed = fn.graphs.replay(key, heap)
        if replayed is not None:
            self.launches += replayed
            return _execute(epilogue, regs, heap)
        self.recording = []
        try:
            out = _execute(rest, regs, heap)
            launches = self.recording
        finally:
            self.recording = None
        fn.graphs.run(key, launches)
        return out

    def _no_groups(self, kernel, g: int, max_groups: int) -> None:
        """A launch of no work-groups does nothing; more than a 2-D grid holds is a package fault."""
        if g > max_groups:
            raise VMError(f"{getattr(kernel, 'name', kernel)}: {g} work-groups exceed the grid limit of "
                          f"{self.max_grid}^2; recompile the package")

    # ---- execution --------------------------------------------------------------------------

    def run(self, name: str, *inputs):
        fn = self.functions[name]
        regs = [None] * fn.nregs
        for r, v in fn.preset.items():
            regs[r] = v
        for i, v in enumerate(inputs):
            regs[i] = v
        heap = [0] * max(len(fn.heap_names), 1)
        if fn.graphs is not None and getattr(self.device, "events", None) is None:  # not while profiling launches
            out = self._run_graphs(fn, regs, heap)
        elif fn.native is None:
            out = _execute(fn.code, regs, heap)
        else:  # the prologue binds the shape heap, one native call runs every launch, the epilogue ends in ret
            prologue, epilogue, call, slots, values = fn.native
            _execute(prologue, regs, heap)
            for j, s in enumerate(slots):
                values[j] = heap[s]
            call()
            out = _execute(epilogue, regs, heap)
        if out is _NO_RET:
            raise VMError(f"{name}: fell off the end without ret")
        return out


_NO_RET = object()


def _execute(code: list, regs: list, heap: list):
    """Run prepared instructions up to the first ret: its value, or _NO_RET when there is none."""
    for ins in code:
        if ins[0] == "call":
            _, f, dst = ins
            v = f(regs, heap)
            if dst is not None:
                regs[dst] = v
        else:
            return ins[1](regs, heap)
    return _NO_RET


def _buf(v):
    return v.buf if isinstance(v, DTensor) else v


def _static_registers(spec: dict) -> set[int]:
    """Registers that hold the same object on every run of a function: parameters and constants
    (registers no instruction writes, past the inputs), views of planned storages (vm.alloc) and
    moves of those. A launch binds them once; everything else (inputs, KV-cache views, tuple items)
    is read on each run."""
    written: dict[int, dict] = {}
    for ins in spec["instructions"]:
        if ins.get("dst") is not None:
            if ins["dst"] in written:
                written[ins["dst"]] = {"fn": "redefined"}
            else:
                written[ins["dst"]] = ins
    static = {r for r in range(spec["num_inputs"], spec["registers"]) if r not in written}
    for ins in spec["instructions"]:
        r = ins.get("dst")
        if r is None or written.get(r) is not ins:
            continue
        if ins.get("fn") == "vm.alloc" or (ins.get("fn") == "vm.move" and ins["args"][0].get("r") in static):
            static.add(r)
    return static
