"""match_cast at run time (the reference interpreter): binding new symbolic variables, checking bound ones."""
import numpy as np
import pytest

import deploycc.op  # noqa: F401  (registers the ops)
from deploycc.interp import Interpreter, MatchCastError
from deploycc.ir import BlockBuilder, Object, Shape, ShapeExpr, Tensor, Tuple, Var, sym
from deploycc.ir import annotation as A

n, m = sym.var("n"), sym.var("m")
ANY_TENSOR = A.TensorAnn(None, "", -1)  # nothing known statically


def run(params, body, *args):
    bb = BlockBuilder()
    with bb.function("f", params, auto_dataflow=True):
        bb.finish(body(bb, *params))
    return Interpreter(bb.module).run("f", *args)


def test_match_cast_binds_a_new_variable_used_later():
    def body(bb, x):
        flat = bb.call("reshape", x, ShapeExpr((n * 4,)))
        y = bb.match_cast(flat, Tensor((m,)), "y")
        ids = bb.call("arange", ShapeExpr((0, m)))  # shaped by the newly bound m
        return Tuple((y, ids, ShapeExpr((m, m - n, m // 4))))
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    y, ids, shape = run([Var("x", Tensor((n, 4)))], body, x)
    np.testing.assert_array_equal(y, x.reshape(12))
    np.testing.assert_array_equal(ids, np.arange(12, dtype=np.int32))
    assert shape == (12, 9, 3)


def test_match_cast_of_a_shape_value():
    def body(bb, x):
        s = bb.match_cast(ShapeExpr((n * 2, n + 1)), Shape([m, n + 1]), "s")
        return Tuple((s, ShapeExpr((m + 1,))))
    assert run([Var("x", Tensor((n,)))], body, np.zeros(5, np.float32)) == ((10, 6), (11,))


def _cast_to(ann):
    return lambda bb, x: bb.match_cast(x, ann, "y")


@pytest.mark.parametrize("value, message", [
    (np.zeros((5, 4), np.int32), "match_cast of y: expected dtype float32, got int32"),
    (np.zeros((2, 3, 4), np.float32), r"match_cast of y: expected 2 dims, got shape \(2, 3, 4\)"),
    (np.zeros((5, 3), np.float32), r"match_cast of y: dimension 4 = 4, but the value has 3 \(shape \(5, 3\)\)"),
    ((5, 4), "match_cast of y: expected a tensor, got tuple"),
])
def test_wrong_runtime_value(value, message):
    with pytest.raises(MatchCastError, match=message):
        run([Var("x", Object)], _cast_to(Tensor((m, 4))), value)


def test_right_runtime_value_passes():
    out = run([Var("x", ANY_TENSOR)], _cast_to(Tensor((m, 4))), np.ones((5, 4), np.float32))
    assert out.shape == (5, 4)


def test_already_bound_variable_must_agree():
    params = [Var("x", Tensor((n, 4))), Var("z", ANY_TENSOR)]
    x = np.zeros((3, 4), np.float32)
    body = lambda bb, x, z: bb.match_cast(z, Tensor((n,)), "y")
    assert run(params, body, x, np.zeros(3, np.float32)).shape == (3,)
    with pytest.raises(MatchCastError, match=r"match_cast of y: dimension n = 3, but the value has 5 \(shape \(5,\)\)"):
        run(params, body, x, np.zeros(5, np.float32))
    expr_body = lambda bb, x, z: bb.match_cast(z, Tensor((2 * n,)), "y")
    with pytest.raises(MatchCastError, match=r"match_cast of y: dimension 2 \* n = 6, but the value has 5"):
        run(params, expr_body, x, np.zeros(5, np.float32))


def test_expression_of_an_unbound_variable_cannot_be_checked():
    with pytest.raises(MatchCastError, match="match_cast of y: symbolic variable 'm' has no value"):
        run([Var("x", ANY_TENSOR)], _cast_to(Tensor((m * 2,))), np.zeros(6, np.float32))


def test_shape_and_tuple_mismatches():
    with pytest.raises(MatchCastError, match=r"match_cast of s: expected 1 values, got \(3, 3\)"):
        run([Var("x", Tensor((n,)))], lambda bb, x: bb.match_cast(ShapeExpr((n, n)), Shape([m]), "s"),
            np.zeros(3, np.float32))
    tup = A.TupleAnn((Tensor((m,)), Tensor((m,), "int32")))
    with pytest.raises(MatchCastError, match=r"match_cast of t\[1\]: expected dtype int32, got float32"):
        run([Var("x", Tensor((n,)))], lambda bb, x: bb.match_cast(Tuple((x, x)), tup, "t"), np.zeros(3, np.float32))


def test_function_arguments_are_matched_too():
    with pytest.raises(MatchCastError, match="f: argument x: expected dtype float32, got float16"):
        run([Var("x", Tensor((n, 4)))], lambda bb, x: x, np.zeros((3, 4), np.float16))
    with pytest.raises(MatchCastError, match=r"f: argument y: dimension n = 3, but the value has 2"):
        run([Var("x", Tensor((n, 4))), Var("y", Tensor((n,)))], lambda bb, x, y: y,
            np.zeros((3, 4), np.float32), np.zeros(2, np.float32))
