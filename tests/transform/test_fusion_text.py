# ruff: noqa: E501  (expected IR text is kept verbatim)
"""annotate_patterns, fuse_ops and fuse_tensor, stated as expected IR text.

The module mixes a hand-written tensor program with no graph-level op (a dequantize loop), a
matmul with an elementwise epilogue, an injective reshape used twice, and an elementwise pair whose
input annotation is an expression (16 * n), so its fused function takes the extra shape parameter
that binds n. Expected texts were read and checked by hand once, then frozen.
"""
import numpy as np

from deploycc import op  # noqa: F401  (registers ops)
from deploycc.interp import Interpreter
from deploycc.ir import BlockBuilder, CallTIR, ShapeExpr, Tensor, Var, sym, tir
from deploycc.transform import legalize
from deploycc.transform.annotate_patterns import annotate_patterns
from deploycc.transform.fuse_ops import fuse_ops
from deploycc.transform.fuse_tensor import fuse_tensor


def dequant_program():
    """A hand-written dequantize loop with no graph-level op: w[r, c] = float(q[r, c]) * s[r]."""
    Q, S, W = tir.Buffer("q", (16, 8), "int32"), tir.Buffer("s", (16,)), tir.Buffer("w", (16, 8))
    its = tir.iters("r c", (16, 8))
    r, c = (tir.v(i) for i in its)
    body = tir.Block("dequantize", its, tir.Store(W, (r, c), tir.cast("float32", Q[r, c]) * S[r]))
    return tir.TensorProgram("dequantize", (Q, S, W), body)

def module():
    n = sym.var("n")
    bb = BlockBuilder()
    bb.module.functions["dequantize"] = dequant_program()
    x, b = Var("x", Tensor((n, 8))), Var("b", Tensor((n, 16)))
    q, s = Var("q", Tensor((16, 8), "int32")), Var("s", Tensor((16,)))
    with bb.function("main", [x, q, s, b], auto_dataflow=True):
        w = bb.emit(CallTIR("dequantize", (q, s), Tensor((16, 8))), "w")
        y = bb.call("linear", x, w)
        z = bb.call("add", y, b)
        t = bb.call("reshape", z, ShapeExpr((n * 16,)))
        e = bb.call("exp", t)
        m = bb.call("multiply", e, t)
        bb.finish(m)
    return legalize(bb.module)



PATTERNS = {"dequantize": "BROADCAST", "linear": "OUTPUT_EWISE_FUSIBLE", "add": "ELEMENTWISE", "reshape": "INJECTIVE",
            "exp": "ELEMENTWISE", "multiply": "ELEMENTWISE"}

FUSE_OPS = """@tensor_program
@attrs(pattern="BROADCAST")
def dequantize(q: Buffer((16, 8), "int32"), s: Buffer((16,), "float32"), w: Buffer((16, 8), "float32")):
    block dequantize(r: S[16], c: S[8]):
        w[r, c] = (float32(q[r, c]) * s[r])

@graph
def main(x: Tensor((n, 8), "float32"), q: Tensor((16, 8), "int32"), s: Tensor((16,), "float32"), b: Tensor((n, 16), "float32")) -> Tensor((16 * n,), "float32"):
    with dataflow():
        add: Tensor((n, 16), "float32") = fused_dequantize_linear_add(q, s, x, b)
        reshape: Tensor((16 * n,), "float32") = call_tir(reshape, [add], Tensor((16 * n,), "float32"))
        multiply: Tensor((16 * n,), "float32") = fused_exp_multiply(reshape, shape([n]))
    return multiply

@tensor_program
@attrs(op="linear", pattern="OUTPUT_EWISE_FUSIBLE")
def linear(x: Buffer((n, 8), "float32"), w: Buffer((16, 8), "float32"), y: Buffer((n, 16), "float32")):
    block matmul(i0: S[n], i1: S[16], k: R[8]):
        init: y[i0, i1] = 0.0
        y[i0, i1] = (y[i0, i1] + (x[i0, k] * w[i1, k]))

@tensor_program
@attrs(op="add", pattern="ELEMENTWISE")
def add(A: Buffer((n, 16), "float32"), B: Buffer((n, 16), "float32"), C: Buffer((n, 16), "float32")):
    block add(i0: S[n], i1: S[16]):
        C[i0, i1] = (A[i0, i1] + B[i0, i1])

@tensor_program
@attrs(op="reshape", pattern="INJECTIVE")
def reshape(x: Buffer((n, 16), "float32"), y: Buffer((d1,), "float32")):
    block reshape(i0: S[d1]):
        y[i0] = x[(i0 // 16) % n, i0 % 16]

@tensor_program
@attrs(op="exp", pattern="ELEMENTWISE")
def exp(X: Buffer((d0,), "float32"), Y: Buffer((d0,), "float32")):
    block exp(i0: S[d0]):
        Y[i0] = exp(X[i0])

@tensor_program
@attrs(op="multiply", pattern="ELEMENTWISE")
def multiply(A: Buffer((d0,), "float32"), B: Buffer((d0,), "float32"), C: Buffer((d0,), "float32")):
    block multiply(i0: S[d0]):
        C[i0] = (A[i0] * B[i0])

@graph
@attrs(primitive=True)
def fused_dequantize_linear_add(q: Tensor((16, 8), "int32"), s: Tensor((16,), "float32"), x: Tensor((n, 8), "float32"), b: Tensor((n, 16), "float32")) -> Tensor((n, 16), "float32"):
    with dataflow():
        w: Tensor((16, 8), "float32") = call_tir(dequantize, [q, s], Tensor((16, 8), "float32"))
        linear: Tensor((n, 16), "float32") = call_tir(linear, [x, w], Tensor((n, 16), "float32"))
        add: Tensor((n, 16), "float32") = call_tir(add, [linear, b], Tensor((n, 16), "float32"))
    return add

@graph
@attrs(primitive=True)
def fused_exp_multiply(reshape: Tensor((16 * n,), "float32"), shape_args: Shape([n])) -> Tensor((16 * n,), "float32"):
    with dataflow():
        exp: Tensor((16 * n,), "float32") = call_tir(exp, [reshape], Tensor((16 * n,), "float32"))
        multiply: Tensor((16 * n,), "float32") = call_tir(multiply, [exp, reshape], Tensor((16 * n,), "float32"))
    return multiply
"""

FUSE_TENSOR = """@graph
def main(x: Tensor((n, 8), "float32"), q: Tensor((16, 8), "int32"), s: Tensor((16,), "float32"), b: Tensor((n, 16), "float32")) -> Tensor((16 * n,), "float32"):
    with dataflow():
        add: Tensor((n, 16), "float32") = call_tir(fused_dequantize_linear_add, [q, s, x, b], Tensor((n, 16), "float32"))
        reshape: Tensor((16 * n,), "float32") = call_tir(reshape, [add], Tensor((16 * n,), "float32"))
        multiply: Tensor((16 * n,), "float32") = call_tir(fused_exp_multiply, [reshape], Tensor((16 * n,), "float32"), sym_args=[n])
    return multiply

@tensor_program
@attrs(op="reshape", pattern="INJECTIVE")
def reshape(x: Buffer((n, 16), "float32"), y: Buffer((d1,), "float32")):
    block reshape(i0: S[d1]):
        y[i0] = x[(i0 // 16) % n, i0 % 16]

@tensor_program
@attrs(pattern="OUTPUT_EWISE_FUSIBLE")
def fused_dequantize_linear_add(a0: Buffer((16, 8), "int32"), a1: Buffer((16,), "float32"), a2: Buffer((n, 8), "float32"), a3: Buffer((n, 16), "float32"), out: Buffer((n, 16), "float32")):
    t1 = alloc((n, 16), "float32", "global")
    block matmul(i0: S[n], i1: S[16], k: R[8]):
        init: t1[i0, i1] = 0.0
        t1[i0, i1] = (t1[i0, i1] + (a2[i0, k] * (float32(a0[i1, k]) * a1[i1])))
    block add(i0_1: S[n], i1_1: S[16]):
        out[i0_1, i1_1] = (t1[i0_1, i1_1] + a3[i0_1, i1_1])

@tensor_program
@attrs(pattern="ELEMENTWISE")
def fused_exp_multiply(a0: Buffer((16 * n,), "float32"), out: Buffer((16 * n,), "float32"), n: int):
    block multiply(i0: S[16 * n]):
        out[i0] = (exp(a0[i0]) * a0[i0])
"""


def test_annotate_patterns_from_loop_level_analysis():
    ann = annotate_patterns(module())
    assert {k: p.attrs["pattern"] for k, p in ann.programs().items()} == PATTERNS


def test_fuse_ops_text():
    assert str(fuse_ops(annotate_patterns(module()))).rstrip("\n") == FUSE_OPS.rstrip("\n")


def test_fuse_tensor_text():
    fused = fuse_tensor(fuse_ops(annotate_patterns(module())))
    assert str(fused).rstrip("\n") == FUSE_TENSOR.rstrip("\n")


def test_fused_module_computes_the_same():
    mod = module()
    fused = fuse_tensor(fuse_ops(annotate_patterns(mod)))
    rng = np.random.default_rng(0)
    args = [rng.standard_normal((3, 8)).astype(np.float32), rng.integers(-8, 8, (16, 8)).astype(np.int32),
            rng.standard_normal(16).astype(np.float32), rng.standard_normal((3, 16)).astype(np.float32)]
    want = Interpreter(mod).run("main", *args)
    got = Interpreter(fused).run("main", *args)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    w = args[1].astype(np.float32) * args[2][:, None]
    z = (args[0] @ w.T + args[3]).reshape(-1)
    np.testing.assert_allclose(got, np.exp(z) * z, rtol=1e-5)
