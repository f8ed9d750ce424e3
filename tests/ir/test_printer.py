"""The text form: stable, both levels, names unique by identity."""
import deploycc.op  # noqa: F401  (registers the ops)
from deploycc.ir import BlockBuilder, Call, ShapeExpr, Tensor, Tuple, Var, sym, tir
from deploycc.ir.printer import function_text, program_text
from deploycc.ir.tir import Alloc, Barrier, Block, Buffer, For, IfThenElse, IterVar, Seq, Store, TensorProgram
from deploycc.transform import legalize


def small_module():
    n, m = sym.var("n"), sym.var("m")
    bb = BlockBuilder()
    x = Var("x", Tensor((n, 4)))
    with bb.function("main", [x], bounds=sym.Bounds().declare(n, hi=128)):
        with bb.dataflow():
            s = bb.call("silu", x)
            flat = bb.emit_output(Call("reshape", (s, ShapeExpr((n * 4,)))), "flat")
        z = bb.match_cast(flat, Tensor((m,)), "z")
        e = bb.call("exp", z)
        bb.finish(bb.call("strided_slice", e, ShapeExpr((m - n, m)), axis=0, name="tail"))
    return bb.module


GRAPH = '''\
@graph
@bounds(n <= 128)
def main(x: Tensor((n, 4), "float32")) -> Tensor((n,), "float32"):
    with dataflow():
        silu: Tensor((n, 4), "float32") = silu(x)
        flat: Tensor((4 * n,), "float32") = reshape(silu, shape([4 * n]))
    z = match_cast(flat, Tensor((m,), "float32"))
    exp: Tensor((m,), "float32") = exp(z)
    tail: Tensor((n,), "float32") = strided_slice(exp, shape([-n + m, m]), axis=0)
    return tail
'''

LEGALIZED = '''\
@graph
@bounds(n <= 128)
def main(x: Tensor((n, 4), "float32")) -> Tensor((n,), "float32"):
    with dataflow():
        silu: Tensor((n, 4), "float32") = call_tir(silu, [x], Tensor((n, 4), "float32"))
        flat: Tensor((4 * n,), "float32") = call_tir(reshape, [silu], Tensor((4 * n,), "float32"))
    z = match_cast(flat, Tensor((m,), "float32"))
    exp: Tensor((m,), "float32") = call_tir(exp, [z], Tensor((m,), "float32"))
    tail: Tensor((n,), "float32") = call_tir(strided_slice, [exp], Tensor((n,), "float32"), sym_args=[-n + m])
    return tail

@tensor_program
@attrs(op="silu")
def silu(X: Buffer((n, 4), "float32"), Y: Buffer((n, 4), "float32")):
    block silu(i0: S[n], i1: S[4]):
        Y[i0, i1] = (X[i0, i1] * sigmoid(X[i0, i1]))

@tensor_program
@attrs(op="reshape")
def reshape(x: Buffer((n, 4), "float32"), y: Buffer((d1,), "float32")):
    block reshape(i0: S[d1]):
        y[i0] = x[(i0 // 4) % n, i0 % 4]

@tensor_program
@attrs(op="exp")
def exp(X: Buffer((m,), "float32"), Y: Buffer((m,), "float32")):
    block exp(i0: S[m]):
        Y[i0] = exp(X[i0])

@tensor_program
@attrs(op="strided_slice")
def strided_slice(x: Buffer((m,), "float32"), y: Buffer((n,), "float32"), d2: int):
    block strided_slice(i0: S[n]):
        y[i0] = x[i0 + d2]
'''


def test_graph_module_text():
    assert str(small_module()) == GRAPH


def test_legalized_module_text():
    assert str(legalize(small_module())) == LEGALIZED


def row_sum_program():
    n, off = sym.SymVar("n"), sym.SymVar("off")
    X, Y, Z = Buffer("X", (n, 16)), Buffer("Y", (n,)), Buffer("Z", (n, 16), "float16")
    acc = Buffer("acc", (1,), "float32", "local")
    i, j, i2 = sym.SymVar("i"), sym.SymVar("j"), sym.SymVar("i")  # two different variables named i
    r = IterVar(sym.SymVar("r"), sym.as_expr(16), "reduce")
    total = Block("sum", (r,), Store(acc, (0,), acc[0] + X[i, r.var]), init=Store(acc, (0,), tir.const(0.0)))
    scale = For(j, sym.as_expr(16), IfThenElse(tir.index(j).cmp("lt", tir.index(off)),
                                               Store(Z, (i, j), tir.cast("float16", X[i, j] * 2.0)),
                                               Store(Z, (i, j), tir.const(0.0, "float16"))), "unroll")
    rows = For(i, n, Alloc(acc, Seq((total, Store(Y, (i,), acc[0]), Barrier(), scale))), "thread", "blockIdx.x")
    again = Block("copy", (IterVar(i2, n),), Store(Y, (i2,), tir.unary("exp", Y[i2])))
    return TensorProgram("row_sum", (X, Y, Z), Seq((rows, again)), (off,), 2)


PROGRAM = '''\
@tensor_program(num_outputs=2)
def row_sum(X: Buffer((n, 16), "float32"), Y: Buffer((n,), "float32"), Z: Buffer((n, 16), "float16"), off: int):
    for i in range(n, thread "blockIdx.x"):
        acc = alloc((1,), "float32", "local")
        block sum(r: R[16]):
            init: acc[0] = 0.0
            acc[0] = (acc[0] + X[i, r])
        Y[i] = acc[0]
        barrier("shared")
        for j in range(16, unroll):
            if (j < off):
                Z[i, j] = float16((X[i, j] * 2.0))
            else:
                Z[i, j] = float16(0.0)
    block copy(i_1: S[n]):
        Y[i_1] = exp(Y[i_1])
'''


def test_tensor_program_text():
    assert program_text(row_sum_program()) == PROGRAM


def test_bound_iterators_and_renaming():
    n = sym.SymVar("n")
    A_, B_ = Buffer("A", (n, 8)), Buffer("B", (n, 8))
    bx, tx = sym.SymVar("bx"), sym.SymVar("tx")
    its = (IterVar(sym.SymVar("i"), sym.as_expr(n), binding=sym.as_expr(bx) // 2),
           IterVar(sym.SymVar("j"), sym.as_expr(8), binding=sym.as_expr(bx) % 2 * 4 + sym.as_expr(tx)))
    i, j = (tir.v(it) for it in its)
    blk = Block("copy", its, Store(B_, (i, j), A_[i, j]))
    prog = TensorProgram("copy", (A_, B_), For(bx, 2 * sym.as_expr(n), For(tx, sym.as_expr(4), blk, "thread", "threadIdx.x"),
                                                "thread", "blockIdx.x"))
    assert program_text(prog, name="copy_v2") == '''\
@tensor_program
def copy_v2(A: Buffer((n, 8), "float32"), B: Buffer((n, 8), "float32")):
    for bx in range(2 * n, thread "blockIdx.x"):
        for tx in range(4, thread "threadIdx.x"):
            block copy(i: S[n] = bx // 2, j: S[8] = 4 * (bx % 2) + tx):
                B[i, j] = A[i, j]
'''


def test_duplicate_names_print_distinctly():
    n1, n2 = sym.var("n"), sym.var("n")
    x1, x2 = Var("x", Tensor((n1, 2))), Var("x", Tensor((n2, n1)))
    bb = BlockBuilder()
    with bb.function("f", [x1, x2]):
        fn = bb.finish(Tuple((x1, x2)))
    assert function_text(fn) == '''\
@graph
def f(x: Tensor((n, 2), "float32"), x_1: Tensor((n_1, n), "float32")) -> \
Tuple[Tensor((n, 2), "float32"), Tensor((n_1, n), "float32")]:
    return (x, x_1)
'''
