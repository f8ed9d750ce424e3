"""The well-formedness checker: real modules pass, each kind of broken module is reported precisely."""
import numpy as np
import pytest

import deploycc.op  # noqa: F401  (registers the ops)
from deploycc import nn
from deploycc.ir import (
    Binding,
    BindingBlock,
    BlockBuilder,
    Call,
    CallDPSLibrary,
    CallFunc,
    CallTIR,
    ExternFunc,
    Function,
    If,
    IRModule,
    MatchCast,
    Object,
    SeqExpr,
    Shape,
    ShapeExpr,
    Tensor,
    Var,
    sym,
    tir,
)
from deploycc.ir import annotation as A
from deploycc.ir.checker import WellFormedError, check, problems
from deploycc.ir.tir import Alloc, Block, Buffer, For, IterVar, Seq, Store, TensorProgram
from deploycc.ir.tir_interp import run_program
from deploycc.models.gpt2 import GPT2Config, GPT2LMHeadModel
from deploycc.models.llama import LlamaConfig, LlamaForCausalLM
from deploycc.models.qwen2 import Qwen2Config, Qwen2ForCausalLM
from deploycc.transform import legalize

# ---- real modules pass, before and after legalize ---------------------------------------------------

LLAMA = dict(vocab_size=37, hidden_size=24, intermediate_size=40, num_hidden_layers=2, num_attention_heads=6,
             num_key_value_heads=2, max_position_embeddings=64)
MODELS = {
    "llama-gqa3": lambda: LlamaForCausalLM(LlamaConfig.from_hf(LLAMA)),
    "llama-tied-headdim": lambda: LlamaForCausalLM(LlamaConfig.from_hf(
        dict(LLAMA, head_dim=8, num_key_value_heads=1, tie_word_embeddings=True))),
    "qwen2-bias": lambda: Qwen2ForCausalLM(Qwen2Config.from_hf(dict(LLAMA, attention_bias=True))),
    "gpt2": lambda: GPT2LMHeadModel(GPT2Config.from_hf(dict(vocab_size=41, n_embd=24, n_layer=2, n_head=3, n_positions=64))),
}


def export(model, ctx=64):
    spec = {"prefill": {"input_ids": nn.spec((1, "seq_len"), "int32"), "cache": nn.kv_cache_spec()},
            "decode": {"input_ids": nn.spec((1, 1), "int32"), "cache": nn.kv_cache_spec()}}
    mod, _ = model.export(spec, bounds={"total_len": ctx, "seq_len": ctx})
    return mod


@pytest.mark.parametrize("name", sorted(MODELS))
def test_exported_and_legalized_models_are_well_formed(name):
    mod = export(MODELS[name]())
    check(mod)
    lowered = legalize(mod)
    assert lowered.programs(), "legalize produced no tensor programs"
    check(lowered)


# ---- helpers for hand-built graph functions ---------------------------------------------------------

n, m = sym.var("n"), sym.var("m")


def function(params, blocks, result, name="f", ret_ann=None, bounds=None):
    return Function(name, tuple(params), SeqExpr(tuple(blocks), result), ret_ann or result.ann,
                    bounds=bounds or sym.Bounds())


def block(*bindings, dataflow=False):
    return BindingBlock(tuple(bindings), dataflow)


def module(*items):
    mod = IRModule()
    for it in items:
        mod.functions[it.name] = it
    return mod


def only_problem(mod):
    found = problems(mod)
    assert len(found) == 1, found
    return found[0]


X = Tensor((n, 4))


def test_check_raises_with_every_problem():
    x, ghost = Var("x", X), Var("ghost", X)
    y, z = Var("y", X), Var("z", Tensor((n, 8)))
    mod = module(function([x], [block(Binding(y, Call("add", (x, ghost)))), block(Binding(z, Call("exp", (y,))))], z))
    with pytest.raises(WellFormedError) as info:
        check(mod)
    lines = str(info.value).splitlines()
    assert lines[0] == "2 well-formedness problem(s):"
    assert lines[1:] == ["function f: %ghost used before it is bound (binding of %y)",
                         'function f: annotation mismatch: %z is declared Tensor((n, 8), "float32") '
                         'but its value is Tensor((n, 4), "float32")']
    assert isinstance(info.value, ValueError)


# ---- scoping --------------------------------------------------------------------------------------

def test_undefined_var():
    x, ghost, y = Var("x", X), Var("ghost", X), Var("y", X)
    mod = module(function([x], [block(Binding(y, Call("add", (x, ghost))))], y))
    assert only_problem(mod) == "function f: %ghost used before it is bound (binding of %y)"


def test_var_used_before_its_binding():
    x, a, b = Var("x", X), Var("a", X), Var("b", X)
    mod = module(function([x], [block(Binding(b, Call("exp", (a,))), Binding(a, Call("exp", (x,))))], b))
    assert only_problem(mod) == "function f: %a used before it is bound (binding of %b)"


def test_var_bound_twice():
    x, a = Var("x", X), Var("a", X)
    mod = module(function([x], [block(Binding(a, Call("exp", (x,))), Binding(a, Call("exp", (x,))))], a))
    assert only_problem(mod) == "function f: %a is bound more than once"


def test_dataflow_var_used_outside_its_block():
    x, lv, out = Var("x", X), Var("lv", X, dataflow=True), Var("out", X)
    mod = module(function([x], [block(Binding(lv, Call("exp", (x,))), dataflow=True)], lv))
    assert only_problem(mod) == "function f: dataflow var %lv used outside its dataflow block (the result)"
    mod = module(function([x], [block(Binding(lv, Call("exp", (x,))), dataflow=True),
                                block(Binding(out, Call("exp", (lv,))))], out))
    assert only_problem(mod) == "function f: dataflow var %lv used outside its dataflow block (binding of %out)"


def test_dataflow_var_bound_outside_a_dataflow_block():
    x, lv = Var("x", X), Var("lv", X, dataflow=True)
    mod = module(function([x], [block(Binding(lv, Call("exp", (x,))))], x))
    assert only_problem(mod) == "function f: dataflow var %lv is bound outside a dataflow block"


def test_branch_bindings_do_not_escape():
    x, c, inner, r, after = Var("x", X), Var("c", Tensor((), "bool")), Var("inner", X), Var("r", X), Var("after", X)
    branch = SeqExpr((block(Binding(inner, Call("exp", (x,)))),), inner)
    cond = If(c, branch, SeqExpr((), x), ann=X)
    ok = function([x, c], [block(Binding(r, cond))], r)
    assert problems(module(ok)) == []
    bad = function([x, c], [block(Binding(r, cond), Binding(after, Call("exp", (inner,))))], after)
    assert only_problem(module(bad)) == "function f: %inner used before it is bound (binding of %after)"


# ---- annotations ----------------------------------------------------------------------------------

def test_annotation_mismatch():
    x, y = Var("x", X), Var("y", Tensor((n, 8)))
    mod = module(function([x], [block(Binding(y, Call("add", (x, x))))], y))
    assert only_problem(mod) == ('function f: annotation mismatch: %y is declared Tensor((n, 8), "float32") '
                                 'but its value is Tensor((n, 4), "float32")')


def test_a_less_specific_annotation_is_fine():
    x, y = Var("x", X), Var("y", Tensor(None, "float32", 2))
    assert problems(module(function([x], [block(Binding(y, Call("add", (x, x))))], y))) == []


def test_op_rule_rejects_the_arguments():
    x, h, y = Var("x", X), Var("h", Tensor((n, 4), "float16")), Var("y", X)
    mod = module(function([x, h], [block(Binding(y, Call("add", (x, h))))], y))
    assert only_problem(mod) == "function f: %y: add: dtype mismatch float32 vs float16; cast one with astype"
    mod = module(function([x], [block(Binding(y, Call("nonsense", (x,))))], y))
    assert only_problem(mod) == "function f: %y: unknown op 'nonsense'"


def test_declared_result_annotation():
    x = Var("x", X)
    mod = module(function([x], [], x, ret_ann=Tensor((n, 5))))
    assert only_problem(mod) == ('function f: declared result Tensor((n, 5), "float32") is not a base of '
                                'the result\'s Tensor((n, 4), "float32")')


def test_call_of_graph_function_is_deduced():
    k = sym.var("k")
    a, r = Var("a", Tensor((k,))), Var("r", Tensor((k,)))
    callee = function([a], [block(Binding(r, Call("exp", (a,))))], r, name="callee")
    x, good, bad = Var("x", Tensor((n,))), Var("good", Tensor((n,))), Var("bad", Tensor((n + 1,)))
    caller = function([x], [block(Binding(good, CallFunc("callee", (x,))), Binding(bad, CallFunc("callee", (x,))))],
                      good, name="caller")
    assert only_problem(module(callee, caller)) == (
        'function caller: annotation mismatch: %bad is declared Tensor((n + 1,), "float32") '
        'but its value is Tensor((n,), "float32")')


# ---- purity ---------------------------------------------------------------------------------------

def test_impure_call_in_dataflow_block():
    cache, kv_len = Var("cache", Object), Var("kv_len", Shape(ndim=1))
    mod = module(function([cache, Var("x", X)], [block(Binding(kv_len, Call("kv.begin", (cache, ShapeExpr((n,))))),
                                                      dataflow=True)], cache))
    assert only_problem(mod) == "function f: impure call kv.begin inside a dataflow block (binding of %kv_len)"


# ---- symbolic variables ---------------------------------------------------------------------------

def test_unbound_symbolic_var():
    x, y = Var("x", X), Var("y", Tensor((m,), "int32"))
    mod = module(function([x], [block(Binding(y, Call("arange", (ShapeExpr((0, m)),), {"dtype": "int32"})))], y))
    assert only_problem(mod) == "function f: symbolic variable m is not defined (binding of %y)"


def test_declared_bounds_do_not_define_variables():
    x, y = Var("x", X), Var("y", Tensor((m,), "int32"))
    mod = module(function([x], [block(Binding(y, Call("arange", (ShapeExpr((0, m)),), {"dtype": "int32"})))], y,
                          bounds=sym.Bounds().declare(m, hi=n)))
    assert only_problem(mod) == "function f: symbolic variable m is not defined (binding of %y)"


def test_match_cast_defines_variables_after_the_binding():
    x, flat, y, z = Var("x", X), Var("flat", Tensor((4 * n,))), Var("y", Tensor((m,))), Var("z", Tensor((m,)))
    cast = MatchCast(y, flat, Tensor((m,)))
    exp = Binding(z, Call("exp", (y,)))
    reshape = Binding(flat, Call("reshape", (x, ShapeExpr((n * 4,)))))
    assert problems(module(function([x], [block(reshape, cast, exp)], z))) == []
    # Using m in the value of the match_cast that defines it is too early.
    early = MatchCast(y, ShapeExpr((m,)), Tensor((m,)))
    found = problems(module(function([x], [block(early)], y)))
    assert "function f: symbolic variable m is not defined (binding of %y)" in found


def test_match_cast_expression_dims_need_defined_variables():
    k = sym.var("k")
    x, y = Var("x", Tensor(None, "float32", 1)), Var("y", Tensor((2 * k,)))
    mod = module(function([x], [block(MatchCast(y, x, Tensor((2 * k,))))], y))
    assert only_problem(mod) == "function f: symbolic variable k is not defined (match_cast of %y)"


def test_param_expression_needs_a_defining_param():
    x = Var("x", Tensor((2 * m,)))
    assert only_problem(module(function([x], [], x))) == (
        "function f: symbolic variable m is not defined (the annotation of param %x)")
    assert problems(module(function([x, Var("s", Shape([m]))], [], x))) == []


# ---- cross-level calls ----------------------------------------------------------------------------

def _exp_program():
    bb = BlockBuilder()
    x = Var("x", Tensor((n,)))
    with bb.function("f", [x]):
        bb.finish(bb.call("exp", x))
    mod = legalize(bb.module)
    return mod.programs()["exp"]


def _call_tir_module(call, params):
    y = Var("y", call.out_ann)
    return module(_exp_program(), function(params, [block(Binding(y, call))], y))


def test_call_tir_well_formed():
    x = Var("x", Tensor((m,)))
    assert problems(_call_tir_module(CallTIR("exp", (x,), Tensor((m,))), [x])) == []


def test_call_tir_arg_count_mismatch():
    x = Var("x", Tensor((m,)))
    mod = _call_tir_module(CallTIR("exp", (x, x), Tensor((m,))), [x])
    assert only_problem(mod) == "function f: call_tir(exp) (binding of %y) passes 2 tensor args, the program takes 1 inputs"


def test_call_tir_sym_args_and_outputs_mismatch():
    x = Var("x", Tensor((m,)))
    found = problems(_call_tir_module(CallTIR("exp", (x,), Tensor((m,)), (m,)), [x]))
    assert found == ["function f: call_tir(exp) (binding of %y) passes 1 sym_args, the program takes 0"]
    two = A.TupleAnn((Tensor((m,)), Tensor((m,))))
    found = problems(_call_tir_module(CallTIR("exp", (x,), two), [x]))
    assert found == ['function f: call_tir(exp) (binding of %y) out annotation Tuple[Tensor((m,), "float32"), '
                     'Tensor((m,), "float32")] does not match the program\'s 1 output buffer(s)']


def test_call_tir_dtype_rank_and_shape_mismatch():
    h = Var("h", Tensor((m,), "float16"))
    assert only_problem(_call_tir_module(CallTIR("exp", (h,), Tensor((m,))), [h])) == (
        'function f: call_tir(exp) (binding of %y) buffer X is float32 with 1 dims, but gets Tensor((m,), "float16")')
    x2 = Var("x2", Tensor((m, 2)))
    assert only_problem(_call_tir_module(CallTIR("exp", (x2,), Tensor((m,))), [x2])) == (
        'function f: call_tir(exp) (binding of %y) buffer X is float32 with 1 dims, but gets Tensor((m, 2), "float32")')
    x = Var("x", Tensor((m,)))
    assert only_problem(_call_tir_module(CallTIR("exp", (x,), Tensor((m + 1,))), [x])) == (
        "function f: call_tir(exp) (binding of %y) buffer Y has shape (m) in the caller's terms, but gets (m + 1)")


def test_call_tir_of_unknown_program_and_unbound_out_var():
    x = Var("x", Tensor((m,)))
    y = Var("y", Tensor((m,)))
    mod = module(function([x], [block(Binding(y, CallTIR("missing", (x,), Tensor((m,)))))], y))
    assert only_problem(mod) == "function f: call_tir of unknown missing (binding of %y)"
    found = problems(_call_tir_module(CallTIR("exp", (x,), Tensor((n,))), [x]))
    assert found[0] == "function f: symbolic variable n is not defined (binding of %y)"


def test_call_dps_library():
    x = Var("x", Tensor((m,)))
    y = Var("y", Tensor((m,)))
    ok = module(ExternFunc("cublas.gemv"), function([x], [block(Binding(y, CallDPSLibrary("cublas.gemv", (x,), Tensor((m,)))))], y))
    assert problems(ok) == []
    z = Var("z", Tensor(None, "float32", 1))
    bad = module(function([x], [block(Binding(z, CallDPSLibrary("lib.f", (x,), Tensor(None, "float32", 1))))], z))
    assert only_problem(bad) == ('function f: call_dps_library(lib.f) needs tensor outputs of known shape, '
                                 'got Tensor(ndim=1, dtype="float32") (binding of %z)')


# ---- tensor programs ------------------------------------------------------------------------------

k = sym.SymVar("k")
A_ = Buffer("A", (k, 8))
OUT = Buffer("out", (k,))


def program(body, params=(A_, OUT), sym_params=()):
    return TensorProgram("p", tuple(params), body, tuple(sym_params))


def row_sum(init=True, body=None, store_idx=None):
    its = tir.iters("i r", (k, 8), "SR")
    i, r = (tir.v(it) for it in its)
    idx = store_idx(i, r) if store_idx else (i,)
    value = body(i, r) if body else OUT[idx] + A_[i, r]
    return Block("sum", its, Store(OUT, idx, value), init=Store(OUT, idx, tir.const(0.0)) if init else None)


def test_well_formed_program():
    assert problems(module(program(row_sum()))) == []


def test_program_loading_an_unknown_buffer():
    other = Buffer("W", (k,))
    its = tir.iters("i", (k,))
    i = tir.v(its[0])
    mod = module(program(Block("copy", its, Store(OUT, (i,), other[i] + other[i]))))  # reported once
    assert only_problem(mod) == "program p: buffer W is loaded but is neither a param nor allocated by an enclosing alloc"


def test_program_using_an_alloc_outside_its_scope():
    tmp = Buffer("tmp", (k,), scope="local")
    its = tir.iters("i", (k,))
    i = tir.v(its[0])
    fill = Alloc(tmp, Block("fill", its, Store(tmp, (i,), tir.const(1.0))))
    its2 = tir.iters("j", (k,))
    j = tir.v(its2[0])
    use = Block("use", its2, Store(OUT, (j,), tmp[j]))
    mod = module(program(Seq((fill, use))))
    assert only_problem(mod) == "program p: buffer tmp is loaded but is neither a param nor allocated by an enclosing alloc"


def test_reduction_block_without_init():
    assert only_problem(module(program(row_sum(init=False)))) == "program p: reduction block sum has no init"


def test_reduction_block_body_form():
    bad = row_sum(body=lambda i, r: A_[i, r] * 2.0)
    assert only_problem(module(program(bad))) == "program p: reduction block sum must store combine(out[...], value)"


def test_reduction_store_indexed_by_reduce_iterator():
    wide = Buffer("out", (k, 8))
    its = tir.iters("i r", (k, 8), "SR")
    i, r = (tir.v(it) for it in its)
    blk = Block("sum", its, Store(wide, (i, r), wide[i, r] + A_[i, r]), init=Store(wide, (i, r), tir.const(0.0)))
    assert only_problem(module(program(blk, params=(A_, wide)))) == (
        "program p: block sum stores out indexed by reduce iterator(s) r")


def test_program_unbound_symbolic_var_and_bound_loops():
    stray = sym.SymVar("stray")
    its = tir.iters("i", (k,))
    i = tir.v(its[0])
    blk = Block("copy", its, Store(OUT, (i,), A_[i, sym.as_expr(stray)]))
    assert only_problem(module(program(blk))) == (
        "program p: symbolic variable stray in an index of A is not bound by an enclosing loop, block, program shape or sym param")
    # The same index is fine under a loop over stray, or as a sym param.
    assert problems(module(program(For(stray, sym.as_expr(8), blk)))) == []
    assert problems(module(program(blk, sym_params=(stray,)))) == []
    bound = Block("copy", (IterVar(i.as_var, sym.as_expr(k), binding=sym.as_expr(stray) * 2),),
                  Store(OUT, (i,), A_[i, 0]))
    assert only_problem(module(program(bound))) == (
        "program p: symbolic variable stray in the binding of i in block copy is not bound by an enclosing loop, "
        "block, program shape or sym param")


def test_program_rank_mismatch_and_missing_output():
    its = tir.iters("i", (k,))
    i = tir.v(its[0])
    short_load = tir.V("load", "float32", (), (A_, (i,)))  # built directly: Buffer[...] would refuse it
    mod = module(program(Block("copy", its, Store(OUT, (i,), short_load))))
    assert only_problem(mod) == "program p: buffer A has 2 dims but is loaded with 1 indices"
    extra = Buffer("out2", (k,))
    mod = module(TensorProgram("p", (A_, OUT, extra), row_sum(), (), num_outputs=2))
    assert only_problem(mod) == "program p: output out2 is never stored"


def test_checked_reduction_program_runs():
    """The reduction form the checker demands is the one the interpreter runs vectorised."""
    prog = program(row_sum())
    check(module(prog))
    a = np.arange(24, dtype=np.float32).reshape(3, 8)
    out = np.zeros(3, np.float32)
    run_program(prog, [a, out])
    np.testing.assert_allclose(out, a.sum(1))
