"""Graph-level constructs in the reference interpreter: call_dps_library, If, calls of graph functions,
and a tensor program with no graph-level op mixed with op calls."""
import numpy as np
import pytest

from deploycc import op  # noqa: F401  (registers ops)
from deploycc.interp import Interpreter
from deploycc.ir import BlockBuilder, CallDPSLibrary, CallFunc, CallTIR, If, SeqExpr, Tensor, Var, sym, tir
from deploycc.ir.expr import Binding, BindingBlock
from deploycc.ir.module import ExternFunc


def _softmax_lib(x, out):
    e = np.exp(x - x.max(-1, keepdims=True))
    out[...] = e / e.sum(-1, keepdims=True)


def test_call_dps_library_and_graph_call():
    n = sym.var("n")
    bb = BlockBuilder()
    bb.module.functions["lib.softmax"] = ExternFunc("lib.softmax")
    x = Var("x", Tensor((n, 8)))
    with bb.function("ident", [x], auto_dataflow=True):
        bb.finish(x)
    y = Var("y", Tensor((n, 8)))
    with bb.function("main", [y], auto_dataflow=True):
        s = bb.emit(CallDPSLibrary("lib.softmax", (y,), Tensor((n, 8))), "s")
        r = bb.emit(CallFunc("ident", (s,)), "r")
        bb.finish(r)
    data = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    out = Interpreter(bb.module, {"lib.softmax": _softmax_lib}).run("main", data)
    np.testing.assert_allclose(out, np.exp(data) / np.exp(data).sum(-1, keepdims=True), rtol=1e-6)
    with pytest.raises(KeyError, match="lib.softmax"):
        Interpreter(bb.module).run("main", data)


def test_if_selects_a_branch():
    x = Var("x", Tensor((4,)))
    c = Var("c", Tensor((), "bool"))
    bb = BlockBuilder()
    with bb.function("f", [c, x], auto_dataflow=True):
        t = Var("t", Tensor((4,)))
        then_b = SeqExpr((BindingBlock((Binding(t, _call("negative", x)),)),), t)
        else_b = SeqExpr((), x)
        bb.finish(bb.emit(If(c, then_b, else_b, ann=Tensor((4,))), "r"))
    a = np.arange(4, dtype=np.float32)
    it = Interpreter(bb.module)
    np.testing.assert_array_equal(it.run("f", np.array(True), a), -a)
    np.testing.assert_array_equal(it.run("f", np.array(False), a), a)


def _call(name, *args):
    from deploycc.ir import Call
    from deploycc.ir.builder import deduce

    c = Call(name, args)
    object.__setattr__(c, "ann", deduce(c))
    return c


def test_custom_tensor_program_without_graph_op():
    """A hand-written dequantize-like program: out[i] = float(q[i]) * scale[i // 4]."""
    n = sym.var("n")
    Q = tir.Buffer("q", (n * 4,), "int32")
    S = tir.Buffer("scale", (n,))
    O = tir.Buffer("out", (n * 4,))
    its = tir.iters("i", (n * 4,))
    i = tir.v(its[0])
    body = tir.Block("dequant", its, tir.Store(O, (i,), tir.cast("float32", Q[i]) * S[i // 4]))
    prog = tir.TensorProgram("dequant", (Q, S, O), body, sym_params=(n.as_var,))
    m = sym.var("m")
    q = Var("q", Tensor((m * 4,), "int32"))
    s = Var("s", Tensor((m,)))
    bb = BlockBuilder()
    bb.module.functions["dequant"] = prog
    with bb.function("main", [q, s], auto_dataflow=True):
        d = bb.emit(CallTIR("dequant", (q, s), Tensor((m * 4,)), (m,)), "d")
        bb.finish(bb.call("silu", d))
    qa = np.arange(8, dtype=np.int32) - 4
    sa = np.array([0.5, 2.0], np.float32)
    out = Interpreter(bb.module).run("main", qa, sa)
    deq = qa.astype(np.float32) * np.repeat(sa, 4)
    np.testing.assert_allclose(out, deq / (1 + np.exp(-deq)), rtol=1e-6)
