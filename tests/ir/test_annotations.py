"""Forward annotation deduction through the op rules, as BlockBuilder emits calls."""
import numpy as np
import pytest

import deploycc.op  # noqa: F401  (registers the ops)
from deploycc.ir import BlockBuilder, CallFunc, Constant, Object, Shape, ShapeExpr, Tensor, Var, sym
from deploycc.ir import annotation as A
from deploycc.ir.builder import deduce, deduce_call_func, tuple_get
from deploycc.op import OpError

n, m, t = sym.var("n"), sym.var("m"), sym.var("t")


def build(params, body, name="f"):
    """Run `body(bb, *params)` inside a fresh function; returns (function, value body returned)."""
    bb = BlockBuilder()
    with bb.function(name, params, auto_dataflow=True):
        out = body(bb, *params)
        fn = bb.finish(out)
    return fn, out


def deduced(params, body):
    return build(params, body)[1].ann


# ---- deduction -------------------------------------------------------------------------------------

def test_reshape_flattens_symbolically():
    x = Var("x", Tensor((n, 4)))
    fn, y = build([x], lambda bb, x: bb.call("reshape", x, ShapeExpr((n * 4,))))
    assert y.ann == Tensor((4 * n,))
    assert fn.ret_ann == Tensor((4 * n,))
    # Element counts are compared in canonical form: (2n, 2) has n*4 elements too.
    assert deduced([x], lambda bb, x: bb.call("reshape", x, ShapeExpr((2 * n, 2)))) == Tensor((2 * n, 2))


def test_concat_adds_symbolic_dims():
    x, y = Var("x", Tensor((n, 8))), Var("y", Tensor((m, 8)))
    assert deduced([x, y], lambda bb, x, y: bb.call("concat", x, y, axis=0)) == Tensor((n + m, 8))
    assert deduced([x, y], lambda bb, x, y: bb.call("concat", x, y, x, axis=0)) == Tensor((2 * n + m, 8))


def test_split_gives_a_tuple():
    x = Var("x", Tensor((n, 12), "float16"))

    def body(bb, x):
        parts = bb.call("split", x, sizes=(4, 8), axis=1)
        assert parts.ann == A.TupleAnn((Tensor((n, 4), "float16"), Tensor((n, 8), "float16")))
        return tuple_get(bb, parts, 1)
    assert deduced([x], body) == Tensor((n, 8), "float16")


def test_permute_dims():
    x = Var("x", Tensor((n, 4, 8)))
    assert deduced([x], lambda bb, x: bb.call("permute_dims", x, axes=(1, 0, 2))) == Tensor((4, n, 8))
    assert deduced([x], lambda bb, x: bb.call("permute_dims", x, axes=(-1, 0, 1))) == Tensor((8, n, 4))


def test_linear_with_and_without_bias():
    x, w, b = Var("x", Tensor((1, n, 16))), Var("w", Tensor((32, 16))), Var("b", Tensor((32,)))
    assert deduced([x, w], lambda bb, x, w: bb.call("linear", x, w)) == Tensor((1, n, 32))
    assert deduced([x, w, b], lambda bb, x, w, b: bb.call("linear", x, w, b)) == Tensor((1, n, 32))


def test_add_broadcasts():
    x, y, z = Var("x", Tensor((n, 1, 8))), Var("y", Tensor((4, 8))), Var("z", Tensor((8,)))
    assert deduced([x, y], lambda bb, x, y: bb.call("add", x, y)) == Tensor((n, 4, 8))
    assert deduced([x, z], lambda bb, x, z: bb.call("multiply", x, z)) == Tensor((n, 1, 8))
    # Equal symbolic dims broadcast with each other; only the constant 1 stretches.
    a, c = Var("a", Tensor((n, 2 * m))), Var("c", Tensor((1, m + m)))
    assert deduced([a, c], lambda bb, a, c: bb.call("add", a, c)) == Tensor((n, 2 * m))


def test_take():
    table, ids = Var("table", Tensor((100, 16))), Var("ids", Tensor((1, n), "int32"))
    assert deduced([table, ids], lambda bb, tb, ids: bb.call("take", tb, ids)) == Tensor((1, n, 16))


def test_attention_grouped_query():
    q, k, v = Var("q", Tensor((n, 8, 4))), Var("k", Tensor((t, 2, 4))), Var("v", Tensor((t, 2, 4)))
    assert deduced([q, k, v], lambda bb, q, k, v: bb.call("attention", q, k, v, scale=0.5)) == Tensor((n, 8, 4))


def test_rope_keeps_the_shape():
    x = Var("x", Tensor((n, 4, 8)))
    freq = Constant(np.ones(4, np.float32))
    out = deduced([x], lambda bb, x: bb.call("rope", x, freq, ShapeExpr((t - n,))))
    assert out == Tensor((n, 4, 8))


def test_astype_and_kv_builtins():
    x, cache = Var("x", Tensor((n, 4))), Var("cache", Object)
    assert deduced([x], lambda bb, x: bb.call("astype", x, dtype="float16")) == Tensor((n, 4), "float16")
    assert deduced([cache], lambda bb, c: bb.call("kv.begin", c, ShapeExpr((n,)))) == Shape(ndim=1)


def test_auto_dataflow_splits_blocks_at_impure_calls():
    x, cache = Var("x", Tensor((n, 4))), Var("cache", Object)

    def body(bb, x, cache):
        a = bb.call("silu", x)
        bb.call("kv.begin", cache, ShapeExpr((n,)))
        return bb.call("exp", a)
    fn, _ = build([x, cache], body)
    assert [(b.dataflow, len(b.bindings)) for b in fn.body.blocks] == [(True, 1), (False, 1), (True, 1)]


# ---- errors ----------------------------------------------------------------------------------------

def raises(params, body, message):
    with pytest.raises(OpError, match=message):
        build(params, body)


def test_reshape_element_count_mismatch():
    x = Var("x", Tensor((n, 4)))
    raises([x], lambda bb, x: bb.call("reshape", x, ShapeExpr((n * 3,))),
           r"reshape: cannot reshape \(n, 4\) to \(3 \* n\): element counts differ")


def test_concat_mismatch():
    x, y = Var("x", Tensor((n, 8))), Var("y", Tensor((m, 4)))
    raises([x, y], lambda bb, x, y: bb.call("concat", x, y, axis=0),
           "concat: inputs must agree on every dimension but the concat axis")


def test_split_sizes_mismatch():
    x = Var("x", Tensor((n, 12)))
    raises([x], lambda bb, x: bb.call("split", x, sizes=(4, 4), axis=1), r"split: sizes \(4, 4\) do not add up to 12")


def test_linear_feature_mismatch():
    x, w = Var("x", Tensor((n, 16))), Var("w", Tensor((32, 8)))
    raises([x, w], lambda bb, x, w: bb.call("linear", x, w),
           r"linear: input features 16 do not match weight \[32, 8\]")


def test_add_dtype_mismatch():
    x, y = Var("x", Tensor((n, 4))), Var("y", Tensor((n, 4), "float16"))
    raises([x, y], lambda bb, x, y: bb.call("add", x, y),
           "add: dtype mismatch float32 vs float16; cast one with astype")


def test_add_shapes_do_not_broadcast():
    x, y = Var("x", Tensor((n, 4))), Var("y", Tensor((m, 4)))
    raises([x, y], lambda bb, x, y: bb.call("add", x, y), "add: shapes do not broadcast: n vs m")


def test_attention_head_mismatch():
    q, k, v = Var("q", Tensor((n, 6, 4))), Var("k", Tensor((t, 4, 4))), Var("v", Tensor((t, 4, 4)))
    raises([q, k, v], lambda bb, q, k, v: bb.call("attention", q, k, v, scale=0.5),
           "attention: 6 query heads are not a multiple of 4 kv heads")


def test_rope_frequency_mismatch():
    x = Var("x", Tensor((n, 4, 8)))
    freq = Constant(np.ones(3, np.float32))
    raises([x], lambda bb, x: bb.call("rope", x, freq, ShapeExpr((0,))), r"rope: inv_freq must be \[head_dim / 2\] = \[4\]")


def test_take_needs_integer_indices():
    table, ids = Var("table", Tensor((100, 16))), Var("ids", Tensor((n,)))
    raises([table, ids], lambda bb, tb, ids: bb.call("take", tb, ids), "take: indices must be int32 or int64, got float32")


def test_unknown_op():
    x = Var("x", Tensor((n,)))
    with pytest.raises(KeyError, match="unknown op 'frobnicate'"):
        build([x], lambda bb, x: bb.call("frobnicate", x))


# ---- calls between graph functions ---------------------------------------------------------------

def _module_with_inner():
    bb = BlockBuilder()
    k = sym.var("k")
    x = Var("x", Tensor((k, 4)))
    with bb.function("inner", [x], auto_dataflow=True):
        bb.finish(bb.call("reshape", x, ShapeExpr((k * 4,))))
    return bb


def test_call_func_binds_the_callee_symbols():
    bb = _module_with_inner()
    x = Var("a", Tensor((m, 4)))
    with bb.function("outer", [x], auto_dataflow=True):
        doubled = bb.call("concat", x, x, axis=0)
        r = bb.emit(CallFunc("inner", (doubled,)), "r")
        outer = bb.finish(r)
    # The callee's k is bound to the caller's 2*m, so its result (4k,) is (8m,) here.
    assert r.ann == Tensor((8 * m,))
    assert outer.ret_ann == Tensor((8 * m,))
    assert deduce_call_func(bb.module["inner"], [Var("y", Tensor((n + 1, 4)))]) == Tensor((4 * n + 4,))
    assert deduce(CallFunc("inner", (x,)), bb.module) == Tensor((4 * m,))


def test_call_func_errors():
    bb = _module_with_inner()
    inner = bb.module["inner"]
    with pytest.raises(TypeError, match="inner takes 1 arguments, got 2"):
        deduce_call_func(inner, [Var("a", Tensor((m, 4))), Var("b", Tensor((m, 4)))])
    with pytest.raises(TypeError, match=r'inner: argument x expects Tensor\(\(m, 4\), "float32"\), got Tensor\(\(m, 5\)'):
        deduce_call_func(inner, [Var("a", Tensor((m, 5)))])
    with pytest.raises(TypeError, match="call of unknown function 'nowhere'"):
        deduce(CallFunc("nowhere", ()), bb.module)
