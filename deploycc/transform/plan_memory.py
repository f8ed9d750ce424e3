"""plan_memory: a static storage plan for every tensor a graph function allocates (Relax Algorithm 3).

Each call_tir output (and each call_dps_library output) and each workspace buffer of the called
program needs memory. Tensors are visited in binding order; a tensor whose last use has passed
returns its storage to a free list, and a new tensor takes a free storage of its dtype when its
size is provably no larger (`sym.Bounds.prove_le` under the function's bounds), or grows one that
is provably no larger than itself. Sizes stay symbolic (`4 * seq_len * hidden`), so one plan serves
every sequence length; each storage's byte count at the declared upper bounds is what a VM
allocates once at load time, and decode then allocates nothing.

Liveness runs from a tensor's definition to its last use anywhere in the function. Aliases carry
uses over: `y = x`, `match_cast(x, ...)`, tuples and their items, and (conservatively) the tensor
result of any builtin or graph-function call keeps its tensor arguments alive. The function's
result lives to the end; an input of `kv.append` lives until the append (the cache copies it).
Workspace buffers live only during their call (those a schedule needs zero at every launch, Schedule.zeroed, are
not planned: the VM gives them a storage of their own). Function parameters and KV-cache views are not
allocations. Branches of an `If` are planned one after the other, which is safe (never both run)
if not optimal.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..ir import annotation as A
from ..ir import sym
from ..ir.expr import (
    Binding,
    Call,
    CallDPSLibrary,
    CallFunc,
    CallTIR,
    Expr,
    Function,
    If,
    MatchCast,
    SeqExpr,
    Tuple,
    TupleGetItem,
    Var,
)
from ..ir.kernel import scheduled
from ..ir.module import IRModule

ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "int32": 4, "int64": 8, "uint32": 4, "uint8": 1,
            "int8": 1, "int16": 2, "bool": 1}


@dataclass
class Storage:
    id: int
    size: sym.Expr  # bytes, in the function's symbolic variables
    bound: int  # bytes at the declared upper bounds: what a VM allocates
    dtype: str


@dataclass
class Lifetime:
    """One planned tensor: a call output (`field` None, or its tuple index) or a workspace buffer
    (`workspace` its index in Schedule.workspace). Alive over binding positions [start, end]."""

    var: Var
    size: sym.Expr
    dtype: str
    start: int
    end: int
    field: int | None = None
    workspace: int | None = None
    storage: int = -1


@dataclass
class MemoryPlan:
    function: str
    storages: list[Storage]
    tensors: dict[Var, int]  # var bound to a single-output call -> storage id
    workspace: dict[Var, list[int]]  # call_tir var -> storage per Schedule.workspace buffer, in order
    unplanned_bytes: int  # sum of every tensor's bound: one allocation each, no reuse
    planned_bytes: int  # sum of the storages' bounds
    tuple_tensors: dict[Var, tuple[int, ...]] = field(default_factory=dict)  # tuple-output call -> per field
    lifetimes: list[Lifetime] = field(default_factory=list)  # every planned tensor, in definition order


# ---- bounds --------------------------------------------------------------------------------------

def function_bounds(fn: Function, extra_bounds: dict[str, int] | None = None) -> sym.Bounds:
    """The function's bounds with `extra_bounds` (variable name -> upper bound) intersected in.
    Names the function does not use are ignored, so one dict may serve prefill and decode."""
    b = sym.Bounds(dict(fn.bounds.lower), dict(fn.bounds.upper))
    if not extra_bounds:
        return b
    by_name: dict[str, sym.SymVar] = {v.name: v for v in b.lower}
    by_name.update({v.name: v for v in b.upper})
    by_name.update({v.name: v for v in _function_vars(fn)})
    for name, hi in extra_bounds.items():
        v = by_name.get(name)
        if v is None:
            continue
        old = b.upper.get(v)
        b.upper[v] = sym.as_expr(hi) if old is None else sym.smin(old, hi, b)
    return b


def _function_vars(fn: Function) -> set[sym.SymVar]:
    out: set[sym.SymVar] = set()
    for p in fn.params:
        out |= p.ann.free_vars()
    for b in _bindings(fn.body):
        out |= b.var.ann.free_vars()
        if isinstance(b, MatchCast):
            out |= b.ann.free_vars()
        if isinstance(b.value, CallTIR):
            for e in b.value.sym_args:
                out |= e.free_vars()
    return out


def _bindings(body: SeqExpr):
    for block in body.blocks:
        for b in block.bindings:
            yield b
            if isinstance(b.value, If):
                yield from _bindings(b.value.then_branch)
                yield from _bindings(b.value.else_branch)


def nbytes(ann: A.Annotation, what: str) -> sym.Expr:
    if not isinstance(ann, A.TensorAnn) or ann.shape is None:
        raise ValueError(f"plan_memory: {what} has no static shape ({A.to_text(ann)}); cannot plan it")
    if ann.dtype not in ITEMSIZE:
        raise ValueError(f"plan_memory: {what} has dtype {ann.dtype!r} of unknown size")
    size = sym.as_expr(ITEMSIZE[ann.dtype])
    for d in ann.shape:
        size = size * d
    return size


def bound_of(size: sym.Expr, bounds: sym.Bounds, what: str) -> int:
    hi = bounds.upper_bound(size)
    if hi is not None:
        return hi
    unbounded = sorted(v.name for v in size.free_vars() if bounds.upper_bound(sym.as_expr(v)) is None)
    names = ", ".join(unbounded) or "?"
    raise ValueError(f"plan_memory: {what} has size {sym.to_python(size)} bytes with no upper bound: "
                     f"declare an upper bound for {names}")


# ---- liveness ------------------------------------------------------------------------------------

class _Liveness:
    """Linearises the bindings (If branches one after the other) and finds each tensor's lifetime.

    `roots` maps each var to the planned tensors its value may be: a set of lifetime indices, or a
    list (one entry per field) for a tuple whose fields are known."""

    def __init__(self, mod: IRModule, reads: dict | None = None):
        self.mod = mod
        self.reads = reads or {}  # a binding's var -> vars its launch reads beyond its value's (vm/kv_attend.py)
        self.pos = 0
        self.roots: dict[Var, object] = {}
        self.lifetimes: list[Lifetime] = []

    def function(self, fn: Function) -> list[Lifetime]:
        result = self.seq(fn.body)
        end = self.pos
        for t in _flatten(result):
            self.lifetimes[t].end = end
        return self.lifetimes

    def seq(self, body: SeqExpr):
        for block in body.blocks:
            for b in block.bindings:
                self.roots[b.var] = self.binding(b)
        self.use(body.result, self.pos - 1)
        return self._roots(body.result)

    def binding(self, b: Binding | MatchCast):
        v = b.value
        if isinstance(v, If):
            self.use(v.cond, self.pos - 1)
            then = self.seq(v.then_branch)
            other = self.seq(v.else_branch)
            return _flatten(then) | _flatten(other)
        p = self.pos
        self.pos += 1
        self.use(v, p)
        for x in self.reads.get(b.var, ()):
            self.use(x, p)
        if isinstance(v, (CallTIR, CallDPSLibrary)):
            out = self.outputs(b.var, v.out_ann, p)
            if isinstance(v, CallTIR):
                self.workspace(b.var, v, p)
            return out
        return self._roots(v)

    def outputs(self, var: Var, ann: A.Annotation, p: int):
        if isinstance(ann, A.TupleAnn):
            out = []
            for i, f in enumerate(ann.fields):
                size = nbytes(f, f"output {i} of {var.name}")
                self.lifetimes.append(Lifetime(var, size, f.dtype, p, p, field=i))
                out.append({len(self.lifetimes) - 1})
            return out
        self.lifetimes.append(Lifetime(var, nbytes(ann, f"output {var.name}"), ann.dtype, p, p))
        return {len(self.lifetimes) - 1}

    def workspace(self, var: Var, call: CallTIR, p: int) -> None:
        prog = self.mod[call.program]
        sched = scheduled(prog)
        if sched is None or not sched.workspace:
            return
        mapping = program_sym_map(prog, call)
        for i, buf in enumerate(sched.workspace):
            if buf in sched.zeroed:  # a counter kept zero between launches: a storage of its own (vm/lower.py)
                continue
            missing = set().union(*(d.free_vars() for d in buf.shape)) - set(mapping)
            if missing:
                names = ", ".join(sorted(v.name for v in missing))
                raise ValueError(f"plan_memory: workspace {buf.name} of {prog.name} (bound to {var.name}) uses "
                                 f"{names}, which no argument shape or sym_arg binds")
            ann = A.Tensor([sym.substitute(d, mapping) for d in buf.shape], buf.dtype)
            self.lifetimes.append(Lifetime(var, nbytes(ann, f"workspace {buf.name} of {var.name}"), buf.dtype,
                                           p, p, workspace=i))

    def use(self, e: Expr, at: int) -> None:
        """Every planned tensor a variable referenced in `e` may be is used at position `at`."""
        if isinstance(e, Var):
            for t in _flatten(self.roots.get(e, set())):
                self.lifetimes[t].end = max(self.lifetimes[t].end, at)
        elif isinstance(e, Tuple):
            for f in e.fields:
                self.use(f, at)
        elif isinstance(e, TupleGetItem):
            for t in _flatten(self._roots(e)):
                self.lifetimes[t].end = max(self.lifetimes[t].end, at)
        elif isinstance(e, (Call, CallTIR, CallDPSLibrary, CallFunc)):
            for a in e.args:
                self.use(a, at)

    def _roots(self, e: Expr):
        if isinstance(e, Var):
            return self.roots.get(e, set())
        if isinstance(e, Tuple):
            return [self._roots(f) for f in e.fields]
        if isinstance(e, TupleGetItem):
            r = self._roots(e.tuple_value)
            return r[e.index] if isinstance(r, list) else r
        if isinstance(e, (Call, CallFunc)):
            # A builtin or callee may return a view of a tensor argument; a result that is not a
            # tensor (the KV-cache object, a shape) holds none.
            args = set().union(*(_flatten(self._roots(a)) for a in e.args)) if e.args else set()
            return args if _holds_tensors(e.ann) else set()
        return set()


def _holds_tensors(ann) -> bool:
    if isinstance(ann, A.TupleAnn):
        return any(_holds_tensors(f) for f in ann.fields)
    return isinstance(ann, A.TensorAnn) or ann is None


def _flatten(r) -> set[int]:
    if isinstance(r, list):
        return set().union(*(_flatten(x) for x in r)) if r else set()
    return set(r)


def program_sym_map(prog, call: CallTIR) -> dict[sym.SymVar, sym.Expr]:
    """The program's symbolic variables in the caller's terms: sym_params from sym_args, then every
    parameter dim that is a bare variable from the matching argument (or output) annotation dim."""
    mapping: dict[sym.SymVar, sym.Expr] = dict(zip(prog.sym_params, call.sym_args))
    tensor_args = [a.ann for a in call.args if not isinstance(a.ann, A.ShapeAnn)]
    outs = list(call.out_ann.fields) if isinstance(call.out_ann, A.TupleAnn) else [call.out_ann]
    for buf, ann in zip(prog.params, tensor_args + outs):
        if not isinstance(ann, A.TensorAnn) or ann.shape is None or len(ann.shape) != len(buf.shape):
            continue
        for d, ad in zip(buf.shape, ann.shape):
            v = d.as_var
            if v is not None and v not in mapping:
                mapping[v] = ad
    return mapping


# ---- the plan ------------------------------------------------------------------------------------

def plan_memory(fn: Function, mod: IRModule, extra_bounds: dict[str, int] | None = None,
                reads: dict | None = None) -> MemoryPlan:
    """`reads`: a binding's var -> the vars its launch reads beyond what its value names (a decode step's attention
    that makes the rope-and-append's work: vm/kv_attend.py), alive until it."""
    bounds = function_bounds(fn, extra_bounds)
    lifetimes = _Liveness(mod, reads).function(fn)
    tensor_bounds = [bound_of(t.size, bounds, _describe(t)) for t in lifetimes]
    storages: list[Storage] = []
    free: list[Storage] = []
    ends: dict[int, list[Lifetime]] = {}
    for t in lifetimes:
        ends.setdefault(t.end, []).append(t)
    by_start: dict[int, list[Lifetime]] = {}
    for t in lifetimes:
        by_start.setdefault(t.start, []).append(t)
    for p in sorted(set(by_start) | set(ends)):
        for t in by_start.get(p, ()):
            s = _take(free, t, bounds)
            if s is None:
                s = Storage(len(storages), t.size, 0, t.dtype)
                storages.append(s)
            t.storage = s.id
        for t in ends.get(p, ()):
            free.append(storages[t.storage])
    for s in storages:
        s.bound = bound_of(s.size, bounds, f"storage {s.id}")
    plan = MemoryPlan(fn.name, storages, {}, {}, sum(tensor_bounds), sum(s.bound for s in storages),
                      lifetimes=lifetimes)
    for t in lifetimes:
        if t.workspace is not None:
            plan.workspace.setdefault(t.var, []).append(t.storage)
        elif t.field is not None:
            plan.tuple_tensors[t.var] = plan.tuple_tensors.get(t.var, ()) + (t.storage,)
        else:
            plan.tensors[t.var] = t.storage
    return plan


def _take(free: list[Storage], t: Lifetime, bounds: sym.Bounds) -> Storage | None:
    """A free storage for `t`, removed from `free`: the tightest one that provably holds it, else
    the largest one it provably covers, grown to its size. Storages of other dtypes, and those whose
    size cannot be compared with `t`'s (unrelated variables), are left alone."""
    same = [s for s in free if s.dtype == t.dtype]
    fits = [s for s in same if s.size == t.size or bounds.prove_le(t.size, s.size)]
    if fits:
        best = min(fits, key=lambda s: (s.size != t.size, _hi(s.size, bounds)))
    else:
        covered = [s for s in same if bounds.prove_le(s.size, t.size)]
        if not covered:
            return None
        best = max(covered, key=lambda s: _hi(s.size, bounds))
        best.size = sym.smax(best.size, t.size, bounds)
    free.remove(best)
    return best


def _hi(size: sym.Expr, bounds: sym.Bounds) -> float:
    return bounds.range_of(size)[1]


def _describe(t: Lifetime) -> str:
    if t.workspace is not None:
        return f"workspace {t.workspace} of {t.var.name}"
    if t.field is not None:
        return f"output {t.field} of {t.var.name}"
    return f"tensor {t.var.name}"


def plan_module(mod: IRModule, functions=("prefill", "decode"), extra_bounds: dict[str, int] | None = None
                ) -> dict[str, MemoryPlan]:
    return {name: plan_memory(mod[name], mod, extra_bounds) for name in functions if name in mod}


# ---- the report (Relax's Table 2) ----------------------------------------------------------------

def weights_bytes(fn: Function) -> int:
    """Bytes of the function's parameters after its inputs (the weights)."""
    total = 0
    for p in fn.params[fn.attrs.get("num_inputs", 0):]:
        size = nbytes(p.ann, f"parameter {p.name}")
        if not size.is_const:
            raise ValueError(f"plan_memory: parameter {p.name} has a symbolic shape {A.to_text(p.ann)}")
        total += size.value
    return total


def memory_report(mod: IRModule, kv_heads: int, head_dim: int, seq_lens=(128, 256, 512),
                  kv_itemsize: int = 4) -> dict:
    """Activation bytes with and without planning, prefill at each seq_len bound and decode, plus the
    weights and the KV cache: the comparison of Relax's Table 2, as a JSON-ready dict.

    A seq_len bound larger than the declared one (the context window) is clipped to it, and
    `effective_seq_len` says so. `total_bytes` is what a VM holding weights, cache and both plans
    (prefill at the largest listed bound) allocates at load time."""
    ctx = mod.attrs.get("context_window")
    layers = mod.attrs.get("num_layers")
    rows = []
    for n in seq_lens:
        fn = mod["prefill"]
        plan = plan_memory(fn, mod, {"seq_len": n})
        eff = function_bounds(fn, {"seq_len": n}).upper_bound(_seq_len(fn))
        rows.append(_row(plan, n, eff))
    if "decode" in mod:
        rows.append(_row(plan_memory(mod["decode"], mod), 1, 1))
    kv = 2 * layers * ctx * kv_heads * head_dim * kv_itemsize if layers and ctx else None
    weights = weights_bytes(mod["prefill"])
    prefill_max = max((r["planned_bytes"] for r in rows if r["function"] == "prefill"), default=0)
    decode = next((r["planned_bytes"] for r in rows if r["function"] == "decode"), 0)
    return {
        "model": mod.attrs.get("model"),
        "context_window": ctx,
        "num_layers": layers,
        "weights_bytes": weights,
        "kv_cache_bytes": kv,
        "activations": rows,
        "total_bytes": weights + (kv or 0) + prefill_max + decode,
    }


def _seq_len(fn: Function) -> sym.Expr:
    v = next((v for v in _function_vars(fn) if v.name == "seq_len"), None)
    return sym.as_expr(v) if v is not None else sym.as_expr(1)


def _row(plan: MemoryPlan, n: int, eff: int | None) -> dict:
    return {
        "function": plan.function,
        "seq_len": n,
        "effective_seq_len": eff,
        "unplanned_bytes": plan.unplanned_bytes,
        "planned_bytes": plan.planned_bytes,
        "tensors": len(plan.lifetimes),
        "storages": len(plan.storages),
        "reduction": 1 - plan.planned_bytes / plan.unplanned_bytes if plan.unplanned_bytes else 0.0,
    }
