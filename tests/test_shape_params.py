"""A function whose parameter annotation is an expression gets the extra shape parameter that binds
its variables (Relax's rule for fused functions), and calls deduce their result through it."""
import numpy as np

from deploycc import op  # noqa: F401  (registers ops)
from deploycc.interp import Interpreter
from deploycc.ir import BlockBuilder, CallFunc, ShapeExpr, Tensor, Var, sym
from deploycc.ir.printer import function_text


def test_expression_annotation_adds_shape_param_and_call_deduces_result():
    bb = BlockBuilder()
    n = sym.var("n")
    x = Var("x", Tensor((2 * n,)))
    with bb.function("halves", [x], auto_dataflow=True):
        y = bb.call("reshape", x, ShapeExpr((n, 2)))
        fn = bb.finish(y)
    assert [p.name for p in fn.params] == ["x", "shape_args"]
    assert "shape_args: Shape([n])" in function_text(fn)
    assert fn.ret_ann == Tensor((n, 2))

    m = sym.var("m")
    a = Var("a", Tensor((2 * m + 2,)))
    with bb.function("main", [a], auto_dataflow=True):
        r = bb.emit(CallFunc("halves", (a, ShapeExpr((m + 1,)))), "r")
        main = bb.finish(r)
    assert main.ret_ann == Tensor((m + 1, 2))
    assert [p.name for p in main.params] == ["a", "shape_args"]  # 2*m + 2 does not define m either

    out = Interpreter(bb.module).run("main", np.arange(8, dtype=np.float32), (3,))
    np.testing.assert_array_equal(out, np.arange(8, dtype=np.float32).reshape(4, 2))


def test_shape_param_is_checked_at_run_time():
    import pytest

    from deploycc.interp import MatchCastError

    bb = BlockBuilder()
    n = sym.var("n")
    x = Var("x", Tensor((2 * n,)))
    with bb.function("f", [x], auto_dataflow=True):
        bb.finish(bb.call("reshape", x, ShapeExpr((n, 2))))
    with pytest.raises(MatchCastError, match=r"dimension 2 \* n = 6, but the value has 8"):
        Interpreter(bb.module).run("f", np.zeros(8, np.float32), (3,))
