"""plan_memory: storage reuse with symbolic sizes (Relax Algorithm 3), checked three ways.

The invariant is checked against lifetimes recomputed here independently of the pass (no two
simultaneously-live tensors share a storage, every output and workspace is assigned, every tensor
provably fits its storage); hand-built functions pin the symbolic decisions; and a simulated VM runs
prefill and decode through views of the planned storages, allocated once, against the plain
interpreter.
"""
from functools import cache

import numpy as np
import pytest

import deploycc
import deploycc.export
import deploycc.pipeline
import deploycc.presets
from deploycc.interp import Interpreter
from deploycc.ir import BlockBuilder, CallTIR, Tensor, Tuple, TupleGetItem, Var, sym, tir
from deploycc.ir import annotation as A
from deploycc.ir.expr import Call, MatchCast
from deploycc.ir.kernel import scheduled
from deploycc.ir.tir_interp import NP_DTYPES
from deploycc.op.attention import RefKVCache
from deploycc.schedule import schedule
from deploycc.transform.merge_matmuls import function_params
from deploycc.transform.plan_memory import ITEMSIZE, function_bounds, memory_report, plan_memory, plan_module
from fixtures import TINY, make_tiny

TARGET = deploycc.presets.load("cpu-opencl").target


@cache
def scheduled_module(name: str):
    model = deploycc.load_model(str(make_tiny(name)))
    return model, deploycc.pipeline.run(deploycc.export.export(model, 64), TARGET, "scheduled")


# ---- the invariant, from lifetimes recomputed here -------------------------------------------------

def _nbytes(ann) -> sym.Expr:
    size = sym.as_expr(ITEMSIZE[ann.dtype])
    for d in ann.shape:
        size = size * d
    return size


def _refs(e) -> list:
    if isinstance(e, Var):
        return [e]
    if isinstance(e, Tuple):
        return [v for f in e.fields for v in _refs(f)]
    if isinstance(e, TupleGetItem):
        return _refs(e.tuple_value)
    if hasattr(e, "args"):
        return [v for a in e.args for v in _refs(a)]
    return []


def expected_lifetimes(fn, mod) -> dict:
    """(var, field or ("ws", i)) -> [start, end] for every allocation of a straight-line function.
    Keys with field None are single outputs; aliases (var, match_cast, tuple items) carry uses on."""
    bindings = [b for blk in fn.body.blocks for b in blk.bindings]
    roots: dict = {}
    life: dict = {}

    def use(keys, at):
        for k in keys:
            life[k][1] = max(life[k][1], at)

    def roots_of(e):
        if isinstance(e, TupleGetItem) and isinstance(e.tuple_value, Var) and e.tuple_value in roots:
            r = roots[e.tuple_value]
            if isinstance(r, list):
                return r[e.index]
        if isinstance(e, Var):
            r = roots.get(e, set())
            return set().union(*r) if isinstance(r, list) else r
        return set().union(*(roots_of(v) for v in _refs(e))) if _refs(e) else set()

    for i, b in enumerate(bindings):
        v = b.value
        for r in _refs(v):
            use(roots_of(r), i)
        if isinstance(v, CallTIR):
            if isinstance(v.out_ann, A.TupleAnn):
                roots[b.var] = [{(b.var, k)} for k in range(len(v.out_ann.fields))]
            else:
                roots[b.var] = {(b.var, None)}
            for k in (roots[b.var] if isinstance(roots[b.var], list) else [roots[b.var]]):
                for key in k:
                    life[key] = [i, i]
            sched = scheduled(mod[v.program])
            for w in range(len(sched.workspace) if sched else 0):
                life[(b.var, ("ws", w))] = [i, i]
        elif isinstance(v, Call) and not isinstance(b.var.ann, A.TensorAnn):
            roots[b.var] = set()  # kv.begin / kv.append: a shape, the cache object
        elif isinstance(v, Call):
            roots[b.var] = set().union(*(roots_of(r) for r in _refs(v))) if _refs(v) else set()
        else:  # an alias: var, match_cast, tuple, tuple item
            roots[b.var] = roots_of(v) if not isinstance(v, Var) else roots.get(v, set())
        if isinstance(b, MatchCast) and isinstance(v, Var):
            roots[b.var] = roots.get(v, set())
    use(roots_of(fn.body.result), len(bindings))
    return life


def check_plan(fn, mod, plan, extra_bounds=None):
    bounds = function_bounds(fn, extra_bounds)
    life = expected_lifetimes(fn, mod)
    storage_of, size_of = {}, {}
    for b in (b for blk in fn.body.blocks for b in blk.bindings):
        v = b.value
        if not isinstance(v, CallTIR):
            continue
        if isinstance(v.out_ann, A.TupleAnn):
            ids = plan.tuple_tensors[b.var]
            assert len(ids) == len(v.out_ann.fields)
            for k, (sid, f) in enumerate(zip(ids, v.out_ann.fields)):
                storage_of[(b.var, k)], size_of[(b.var, k)] = sid, _nbytes(f)
        else:
            storage_of[(b.var, None)], size_of[(b.var, None)] = plan.tensors[b.var], _nbytes(v.out_ann)
        sched = scheduled(mod[v.program])
        ws = plan.workspace.get(b.var, [])
        assert len(ws) == (len(sched.workspace) if sched else 0), f"{b.var.name}: workspace not all assigned"
        sizes = [t.size for t in plan.lifetimes if t.var is b.var and t.workspace is not None]
        for w, (sid, size) in enumerate(zip(ws, sizes)):
            storage_of[(b.var, ("ws", w))], size_of[(b.var, ("ws", w))] = sid, size
    assert set(storage_of) == set(life)
    storages = {s.id: s for s in plan.storages}
    for key, sid in storage_of.items():
        s = storages[sid]
        assert bounds.prove_le(size_of[key], s.size), f"{key}: {size_of[key]} does not fit storage {s.size}"
        assert s.bound == bounds.upper_bound(s.size)
    keys = sorted(life, key=lambda k: life[k])
    for i, a in enumerate(keys):
        for b in keys[i + 1:]:
            if life[b][0] > life[a][1]:
                break
            assert storage_of[a] != storage_of[b], f"{a} {life[a]} and {b} {life[b]} are both live in one storage"
    assert plan.planned_bytes == sum(s.bound for s in plan.storages)
    assert plan.unplanned_bytes == sum(bounds.upper_bound(s) for s in size_of.values())


@pytest.mark.parametrize("name", sorted(TINY))
def test_invariant_on_tiny_models(name):
    _, mod = scheduled_module(name)
    for extra in (None, {"seq_len": 16}):
        for fname, plan in plan_module(mod, extra_bounds=extra).items():
            check_plan(mod[fname], mod, plan, extra)


def test_planning_reduces_bytes():
    _, mod = scheduled_module("llama-gqa1")
    plans = plan_module(mod)
    for fname in ("prefill", "decode"):
        assert plans[fname].planned_bytes < plans[fname].unplanned_bytes
        assert len(plans[fname].storages) < len(plans[fname].lifetimes)
    # Prefill sizes are multiples of seq_len; extra bounds shrink the bytes, not the plan's shape.
    # (prefill_all: prefill keeps only the last position for the head, so its logits are constant-size.)
    full = plan_memory(mod["prefill_all"], mod)
    small = plan_memory(mod["prefill_all"], mod, {"seq_len": 8})
    assert [s.size for s in small.storages] == [s.size for s in full.storages]
    assert small.planned_bytes * 8 == full.planned_bytes


def test_decode_plan_is_constant():
    _, mod = scheduled_module("llama-gqa3-llama3rope")
    plan = plan_memory(mod["decode"], mod)
    assert plan.storages and all(s.size.is_const and s.size.value == s.bound for s in plan.storages)
    assert all(t.size.is_const for t in plan.lifetimes)


def test_memory_report():
    model, mod = scheduled_module("llama-gqa1")
    cfg = model.config
    r = memory_report(mod, cfg.num_key_value_heads, cfg.head_dim, seq_lens=(16, 32, 128))
    assert [(x["function"], x["seq_len"], x["effective_seq_len"]) for x in r["activations"]] == [
        ("prefill", 16, 16), ("prefill", 32, 32), ("prefill", 128, 64), ("decode", 1, 1)]
    assert all(x["planned_bytes"] < x["unplanned_bytes"] for x in r["activations"])
    assert r["weights_bytes"] == sum(a.size * 4 for _, a in model.params())
    assert r["kv_cache_bytes"] == 2 * cfg.num_hidden_layers * 64 * cfg.num_key_value_heads * cfg.head_dim * 4


# ---- hand-built functions ---------------------------------------------------------------------------

def _program(name: str, factor_in: int, factor_out: int):
    """out[i] = x[i * factor_in // factor_out] * 2 over out: (factor_out * k,), x: (factor_in * k,)."""
    k = sym.var("k")
    X, O = tir.Buffer("x", (k * factor_in,)), tir.Buffer("out", (k * factor_out,))
    its = tir.iters("i", (k * factor_out,))
    i = tir.v(its[0])
    body = tir.Block(name, its, tir.Store(O, (i,), X[(i * factor_in) // factor_out] * 2.0))
    return tir.TensorProgram(name, (X, O), body, (k.as_var,))


def _module(bounds: sym.Bounds):
    n, m = sym.var("n"), sym.var("m")
    bb = BlockBuilder()
    for prog in (_program("copy", 1, 1), _program("expand4", 1, 4), _program("half", 4, 2), _program("same2", 2, 2)):
        bb.module.functions[prog.name] = prog
    x, y = Var("x", Tensor((n,))), Var("y", Tensor((m,)))
    with bb.function("main", [x, y], bounds=bounds, auto_dataflow=True):
        a = bb.emit(CallTIR("expand4", (x,), Tensor((4 * n,)), (n,)), "a")
        b = bb.emit(CallTIR("half", (a,), Tensor((2 * n,)), (n,)), "b")
        c = bb.emit(CallTIR("same2", (b,), Tensor((2 * n,)), (n,)), "c")
        d = bb.emit(CallTIR("copy", (y,), Tensor((m,)), (m,)), "d")
        e = bb.emit(CallTIR("copy", (x,), Tensor((n,)), (n,)), "e")
        f = bb.emit(CallTIR("copy", (e,), Tensor((n,)), (n,)), "f")
        g = bb.emit(CallTIR("expand4", (f,), Tensor((4 * n,)), (n,)), "g")
        bb.finish(Tuple((c, d, g)))
    return bb.module, {v.name: v for v in (a, b, c, d, e, f, g)}, n, m


def test_symbolic_reuse():
    mod, v, n, m = _module(sym.Bounds())
    fn = mod["main"]
    fn.bounds.declare(n, 1, 100).declare(m, 1, 100)
    plan = plan_memory(fn, mod)
    check_plan(fn, mod, plan)
    t = plan.tensors
    size = {s.id: s.size for s in plan.storages}
    assert t[v["c"]] == t[v["a"]]  # 2n fits the 4n that a left free
    assert t[v["d"]] not in (t[v["a"]], t[v["b"]])  # m and 2n: neither provably fits the other
    assert t[v["e"]] == t[v["b"]]  # n fits b's 2n ...
    assert t[v["g"]] == t[v["e"]] and size[t[v["g"]]] == 16 * n  # ... and grows to g's 4n once e is dead
    assert len(plan.storages) == 4  # a/c: 4n, b/e/g: 4n, d: m, f: n (floats)
    assert plan.planned_bytes == 4 * (400 + 400 + 100 + 100)
    assert plan.unplanned_bytes == 4 * (400 + 200 + 200 + 100 + 100 + 100 + 400)

    # m <= n makes the m-sized copy provably fit b's 2n storage.
    mod2, v2, n2, m2 = _module(sym.Bounds())
    fn2 = mod2["main"]
    fn2.bounds.declare(n2, 1, 100).declare(m2, 1, n2)
    plan2 = plan_memory(fn2, mod2)
    check_plan(fn2, mod2, plan2)
    assert plan2.tensors[v2["d"]] == plan2.tensors[v2["b"]]


def test_unbounded_variable_is_named():
    mod, _, n, m = _module(sym.Bounds())
    mod["main"].bounds.declare(n, 1, 100)
    with pytest.raises(ValueError, match="upper bound for m"):
        plan_memory(mod["main"], mod)
    # An extra bound supplies what the declaration lacked.
    assert plan_memory(mod["main"], mod, {"m": 10}).planned_bytes > 0


def test_workspace_is_sized_in_the_callers_variables():
    """A program whose intermediate the row rule cannot keep in registers: the fallback makes it a
    global workspace buffer, planned for the duration of its call only."""
    k = sym.var("k")
    X, O, T = tir.Buffer("x", (k,)), tir.Buffer("out", (k,)), tir.Buffer("t", (k,))
    its = tir.iters("i", (k,))
    i = tir.v(its[0])
    double = tir.Block("double", its, tir.Store(T, (i,), X[i] * 2.0))
    its = tir.iters("j r", (k, k), "SR")
    j, r = (tir.v(x) for x in its)
    total = tir.Block("total", its, tir.Store(O, (j,), O[j] + T[r]), init=tir.Store(O, (j,), tir.const(0.0)))
    prog = tir.TensorProgram("sum_double", (X, O), tir.Alloc(T, tir.Seq((double, total))))
    n = sym.var("n")
    bb = BlockBuilder()
    bb.module.functions["sum_double"] = prog
    bb.module.functions["copy"] = _program("copy", 1, 1)
    x = Var("x", Tensor((3 * n,)))
    with bb.function("main", [x], bounds=sym.Bounds().declare(n, 1, 10), auto_dataflow=True):
        a = bb.emit(CallTIR("copy", (x,), Tensor((3 * n,)), (3 * n,)), "a")
        s = bb.emit(CallTIR("sum_double", (a,), Tensor((3 * n,))), "s")
        t = bb.emit(CallTIR("copy", (s,), Tensor((3 * n,)), (3 * n,)), "t")
        bb.finish(t)
    mod = schedule(bb.module, TARGET)
    assert scheduled(mod["sum_double"]).rule == "fallback"
    fn = mod["main"]
    plan = plan_memory(fn, mod)
    check_plan(fn, mod, plan)
    (ws,) = plan.workspace[s]
    assert ws not in (plan.tensors[a], plan.tensors[s])
    assert [t.size for t in plan.lifetimes if t.workspace is not None] == [12 * n]
    assert plan.tensors[t] in (plan.tensors[a], ws)  # both are free again by then


# ---- a simulated VM: every call output is a view of a storage allocated once ---------------------

class PlannedInterpreter(Interpreter):
    def __init__(self, mod, plans):
        super().__init__(mod)
        self.plans = plans
        # One byte array per storage at its bound, filled with 0xFF (NaN as float32), so reading
        # memory a program did not write shows up in the logits.
        self.arenas = {f: [np.full(s.bound, 0xFF, np.uint8) for s in p.storages] for f, p in plans.items()}
        self.owner = {}
        for f in plans:
            for blk in mod[f].body.blocks:
                for b in blk.bindings:
                    if isinstance(b.value, CallTIR):
                        self.owner[b.value] = (f, b.var)
        self.current = None

    def eval(self, e, values, env):
        if isinstance(e, CallTIR):
            self.current = self.owner[e]
        return super().eval(e, values, env)

    def alloc(self, ann, env):
        f, var = self.current
        plan = self.plans[f]
        if isinstance(ann, A.TupleAnn):
            return tuple(self._view(f, sid, fa, env) for sid, fa in zip(plan.tuple_tensors[var], ann.fields))
        return self._view(f, plan.tensors[var], ann, env)

    def _view(self, f, sid, ann, env):
        shape = tuple(int(sym.evaluate(d, env)) for d in ann.shape)
        dtype = np.dtype(NP_DTYPES[ann.dtype])
        n = int(np.prod(shape)) * dtype.itemsize
        arena = self.arenas[f][sid]
        assert n <= arena.size
        return arena[:n].view(dtype).reshape(shape)


def test_planned_storages_give_the_same_logits():
    model, mod = scheduled_module("llama-gqa1")
    cfg = model.config
    params = [np.ascontiguousarray(a, dtype=np.float32) for a in function_params(mod, model.params())]
    plans = plan_module(mod)
    planned = PlannedInterpreter(mod, plans)
    arenas = [id(a) for f in planned.arenas.values() for a in f]
    ref = Interpreter(mod)

    def cache():
        return RefKVCache(cfg.num_hidden_layers, 64, cfg.num_key_value_heads, cfg.head_dim)

    c_ref, c_plan = cache(), cache()
    ids = np.array([[3, 14, 15, 92, 65, 35, 89]], np.int32)
    want = ref.run("prefill", ids, c_ref, *params)
    got = planned.run("prefill", ids, c_plan, *params).copy()  # the result is a view of a storage
    assert np.abs(got - want).max() == 0
    token = int(want[0, -1].argmax())
    for _ in range(3):
        step = np.array([[token]], np.int32)
        want = ref.run("decode", step, c_ref, *params)
        got = planned.run("decode", step, c_plan, *params).copy()
        assert np.isfinite(got).all() and np.abs(got - want).max() == 0
        token = int(want[0, -1].argmax())
    assert [id(a) for f in planned.arenas.values() for a in f] == arenas  # nothing allocated per call
