"""Graph functions printed as Python on torch (deploycc.topython): the printed prefill / prefill_all /
decode of every tiny architecture, at the exported and the fused stage, run on torch and give the
reference session's logits (max |diff| <= 1e-4; observed ~1e-7) for a 7-token prompt and 3 decode
steps; the fused stage also with its tensor programs on OpenCL and WebGPU; SmolLM2 at the exported
stage for a natural prompt, prefill + 2 decode steps (5e-4; observed 3e-5 to 1.2e-4: float32 rounding of
torch's BLAS vs numpy's over 30 layers, so the margin is 2x, not orders of magnitude); every op's
torch form against its numpy reference; the printed text of small functions; and an edited printout
that records an intermediate tensor (the debugging workflow)."""
import numpy as np
import pytest
import torch
from conftest import require_device

import deploycc
from deploycc import pipeline
from deploycc.export import export
from deploycc.interp import Interpreter
from deploycc.ir import BlockBuilder, CallDPSLibrary, CallTIR, If, Object, SeqExpr, Shape, Tensor, Tuple, TupleGetItem, Var, sym
from deploycc.ir.builder import shape_of
from deploycc.ir.expr import Binding, BindingBlock, Call
from deploycc.ir.module import ExternFunc
from deploycc.op.attention import RefKVCache
from deploycc.pymodule import TorchKVCache, torch_weights
from deploycc.topython import (
    OPS,
    function_to_python,
    load_python,
    module_to_python,
)

from .test_pymodule import matmul_program, softmax_lib

PROMPT = [3, 1, 4, 1, 5, 9, 2]
TOL = 1e-4
SMOL_TOL = 5e-4  # SmolLM2: see test_smollm2_printed_as_python


def compare_with_reference(py, model, ref, ids, decode_steps, context=None, all_logits=True, mod=None):
    """Run the printed module and the reference session side by side; return the worst |diff|."""
    ids_t = torch.tensor([ids], dtype=torch.int32)
    weights = torch_weights(model, mod)
    worst = []
    if all_logits:
        ref.reset()
        got = py.prefill_all(ids_t, TorchKVCache.for_model(model, context), *weights)[0]
        worst.append(np.abs(got.numpy() - ref.prefill(ids, all_logits=True)).max())
    ref.reset()
    cache = TorchKVCache.for_model(model, context)
    want = ref.prefill(ids)
    worst.append(np.abs(py.prefill(ids_t, cache, *weights)[0, -1].numpy() - want).max())
    token = int(np.argmax(want))
    for _ in range(decode_steps):
        want = ref.decode(token)
        got = py.decode(torch.tensor([[token]], dtype=torch.int32), cache, *weights)[0, -1]
        worst.append(np.abs(got.numpy() - want).max())
        token = int(np.argmax(want))
    assert cache.length == len(ids) + decode_steps
    return max(worst)


@pytest.fixture(scope="module")
def tiny(tiny_path):
    model = deploycc.load_model(str(tiny_path))
    return model, export(model), deploycc.reference_session(model)


@pytest.mark.parametrize("stage", ["exported", "fused"])
def test_tiny_models_printed_as_python(tiny, stage):
    model, exported, ref = tiny
    mod = pipeline.run(exported, None, stage)
    source = module_to_python(mod)
    assert source.count("\n    def ") == 3  # prefill, prefill_all, decode
    if stage == "fused":
        assert "self.call_tir(" in source and "F.linear" not in source
    else:
        assert "self.call_tir(" not in source and "F.linear(" in source
    py = load_python(source, mod, "host")
    worst = compare_with_reference(py, model, ref, PROMPT, 3, mod=mod)
    assert worst <= TOL, f"{stage}: max |diff| {worst}"


@pytest.mark.parametrize("device", ["opencl", "webgpu"])
@pytest.mark.parametrize("name", ["llama-gqa1", "gpt2-odd"])
def test_fused_python_runs_tensor_programs_on_a_device(name, device):
    from fixtures import make_tiny

    require_device(device)
    model = deploycc.load_model(str(make_tiny(name)))
    mod = pipeline.run(export(model), None, "fused")
    py = load_python(module_to_python(mod, ["prefill", "decode"]), mod, device)
    worst = compare_with_reference(py, model, deploycc.reference_session(model), PROMPT, 3, all_logits=False,
                                   mod=mod)
    assert worst <= TOL and py.run_program.launches > 0


def test_a_float16_cache_prints_its_rounding():
    """A module whose KV cache is float16 (the CUDA presets') prints each append's keys and values rounded to half,
    as the reference cache stores them: within TOL of the reference that rounds alike, and further from the one
    that does not (the negative control)."""
    from fixtures import make_tiny

    model = deploycc.load_model(str(make_tiny("llama-gqa3-llama3rope")))
    mod = export(model, kv_cache="float16")
    source = module_to_python(mod)
    assert source.count(".to(torch.float16).float()") == 2 * 3 * model.config.num_hidden_layers  # k, v; 3 functions
    py = load_python(source, mod, "host")
    half = compare_with_reference(py, model, deploycc.reference_session(model, kv_cache="float16"), PROMPT, 3, mod=mod)
    full = compare_with_reference(py, model, deploycc.reference_session(model), PROMPT, 3, mod=mod)
    print(f"half cache: {half:.2e} from the rounding reference, {full:.2e} from the float32 one")
    assert half <= TOL < full, (half, full)


def test_edited_printout_records_an_intermediate(tiny_path):
    """The debugging workflow: insert a line into the printed prefill, run it, look at the tensor."""
    model = deploycc.load_model(str(tiny_path))
    mod = export(model)
    source = module_to_python(mod, ["prefill"])
    target = next(line for line in source.splitlines() if line.lstrip().startswith("add1 = "))
    indent = target[: len(target) - len(target.lstrip())]
    edited = source.replace(target + "\n", f"{target}\n{indent}self.seen.append(add1.norm(dim=-1))\n")
    py = load_python(edited, mod, "host")
    py.seen = []
    logits = py.prefill(torch.tensor([PROMPT], dtype=torch.int32), TorchKVCache.for_model(model), *torch_weights(model))
    (norms,) = py.seen
    assert norms.shape == (1, len(PROMPT)) and torch.all(norms > 0)
    ref = deploycc.reference_session(model)
    assert np.abs(logits[0, -1].numpy() - ref.prefill(PROMPT)).max() <= TOL


@pytest.mark.model
@pytest.mark.parametrize("stage", ["exported", "fused"])
def test_smollm2_printed_as_python(smollm2_path, stage):
    from deploycc.pipeline import run as run_pipeline
    from deploycc.runtime.tokenizer import Tokenizer

    model = deploycc.load_model(smollm2_path)
    mod = run_pipeline(export(model, 64), None, stage)
    py = load_python(module_to_python(mod, ["prefill", "decode"]), mod, "host")
    ids = Tokenizer.from_dir(smollm2_path).encode("The capital of France is", add_special_tokens=False)
    ref = deploycc.reference_session(model, context_window=64)
    worst = compare_with_reference(py, model, ref, ids, 2, 64, all_logits=False, mod=mod)
    print(f"SmolLM2 {stage} stage as Python: max |diff| {worst:.2e}")
    # 30 layers of float32 rounding, torch's kernels against numpy's: observed 3e-5 to 1.2e-4.
    assert worst <= SMOL_TOL, f"max |diff| {worst}"


# ---- a small function: expected text and runs --------------------------------------------------

def attention_block():
    """The KV-cache pattern of the models, small: begin, append, keys/values with match_cast, attention."""
    n, t = sym.var("n"), sym.var("total_len")
    bb = BlockBuilder()
    x, cache, g = Var("x", Tensor((1, n, 8))), Var("cache", Object), Var("g", Tensor((8,)))
    with bb.function("block", [x, cache, g]):
        kv_len = bb.call("kv.begin", cache, shape_of([n]), name="kv_len")
        bb.match_cast(kv_len, Shape([t]), "total")
        h = bb.call("rms_norm", x, g, eps=1e-5, name="h")
        q = bb.call("reshape", h, shape_of([n, 2, 4]), name="q")
        c1 = bb.call("kv.append", cache, q, q, layer=0, name="cache1")
        k = bb.match_cast(bb.call("kv.keys", c1, layer=0, name="k_raw"), Tensor((t, 2, 4)), "k")
        v = bb.match_cast(bb.call("kv.values", c1, layer=0, name="v_raw"), Tensor((t, 2, 4)), "v")
        a = bb.call("attention", q, k, v, scale=0.5, name="a")
        last = bb.call("strided_slice", a, shape_of([n - 1, n]), axis=0, name="last")
        bb.finish(bb.call("silu", last, name="out"))
    return bb.module


ATTENTION_BLOCK = '''\
def block(self, x, cache, g):
    n = x.shape[1]
    total_len = cache.begin(n)
    h = F.rms_norm(x, g.shape, g, eps=1e-05)  # (1, n, 8) float32
    q = h.reshape(n, 2, 4)  # (n, 2, 4) float32
    cache1 = cache.append(0, q, q)
    k = cache1.keys(0)
    assert k.shape == (total_len, 2, 4), k.shape
    v = cache1.values(0)
    assert v.shape == (total_len, 2, 4), v.shape
    a = causal_attention(q, k, v, scale=0.5)  # (n, 2, 4) float32
    last = a[n - 1:n]  # (1, 2, 4) float32
    out = F.silu(last)  # (1, 2, 4) float32
    return out
'''


def mixed_function():
    """A match_cast that defines a variable from a tensor shape, call_tir, a library call, arange."""
    m = sym.var("m")
    bb = BlockBuilder()
    bb.module.functions["matmul"] = matmul_program()
    bb.module.functions["my_softmax"] = ExternFunc("my_softmax")
    x, w = Var("x", Tensor(None, "float32", 2)), Var("w", Tensor((4, 3)))
    with bb.function("mix", [x, w]):
        y = bb.match_cast(x, Tensor((m, 4)), "y")
        z = bb.emit(CallTIR("matmul", (y, w), Tensor((m, 3))), "z")
        s = bb.emit(CallDPSLibrary("my_softmax", (z,), Tensor((m, 3))), "s")
        i = bb.call("astype", bb.call("arange", shape_of([0, m]), dtype="int32", name="i"), dtype="float32", name="f")
        r = bb.call("reshape", i, shape_of([m, 1]), name="r")
        bb.finish(bb.call("concat", s, r, axis=1, name="c"))
    return bb.module


MIXED = '''\
def mix(self, x, w):
    y = x
    m = y.shape[0]
    assert y.shape == (m, 4), y.shape
    z = self.call_tir("matmul", [y, w], (m, 3), "float32")
    s = self.call_dps_library("my_softmax", [z], (m, 3), "float32")
    i = torch.arange(0, m, dtype=torch.int32)  # (m,) int32
    f = i.to(torch.float32)  # (m,) float32
    r = f.reshape(m, 1)  # (m, 1) float32
    c = torch.cat([s, r], dim=1)  # (m, 4) float32
    return c
'''


def test_printed_text_of_small_functions():
    assert function_to_python(attention_block()["block"]) == ATTENTION_BLOCK
    assert function_to_python(mixed_function()["mix"]) == MIXED


def test_small_functions_run_like_the_interpreter():
    mod = attention_block()
    py = load_python(module_to_python(mod), mod, "host")
    rng = np.random.default_rng(0)
    g = rng.standard_normal(8).astype(np.float32)
    ref_cache, cache = RefKVCache(1, 16, 2, 4), TorchKVCache(1, 16, 2, 4)
    for n in (5, 1, 1):  # a prompt, then two steps against the cache
        x = rng.standard_normal((1, n, 8)).astype(np.float32)
        want = Interpreter(mod).run("block", x, ref_cache, g)
        got = py.block(torch.from_numpy(x), cache, torch.from_numpy(g))
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)
    mod = mixed_function()
    py = load_python(module_to_python(mod), mod, "host", library={"my_softmax": softmax_lib})
    x, w = rng.standard_normal((6, 4)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32)
    want = Interpreter(mod, {"my_softmax": softmax_lib}).run("mix", x, w)
    np.testing.assert_allclose(py.mix(torch.from_numpy(x), torch.from_numpy(w)).numpy(), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(AssertionError, match=r"torch.Size\(\[6, 3\]\)"):  # the match_cast check
        py.mix(torch.zeros(6, 3), torch.from_numpy(w))


# ---- every op's torch form -------------------------------------------------------------------

def op_zoo():
    """One function calling every op that has a torch form (rms_norm, rope, attention, reshape and
    strided_slice are also in the models and in attention_block)."""
    n = sym.var("n")
    bb = BlockBuilder()
    a, b = Var("a", Tensor((n, 6))), Var("b", Tensor((n, 6)))
    w, bias, ids = Var("w", Tensor((5, 6))), Var("bias", Tensor((6,))), Var("ids", Tensor((n,), "int32"))
    with bb.function("zoo", [a, b, w, bias, ids]):
        outs = [bb.call(o, a, b) for o in ("add", "subtract", "multiply", "maximum", "minimum")]
        pos = bb.call("add", bb.call("multiply", b, b), bb.call("exp", a))
        outs.append(bb.call("divide", a, pos))
        outs += [bb.call(o, a) for o in ("silu", "gelu_tanh", "exp", "tanh", "sigmoid", "negative")]
        outs += [bb.call("sqrt", pos), bb.call("rsqrt", pos), bb.call("softmax", a, axis=-1)]
        outs.append(bb.call("astype", bb.call("astype", a, dtype="float16"), dtype="float32"))
        outs += [bb.call("layer_norm", a, bias, bias, eps=1e-5), bb.call("rms_norm", a, bias, eps=1e-6)]
        wt = bb.call("permute_dims", w, axes=(1, 0))  # (6, 5)
        outs.append(bb.call("linear", bb.call("linear", a, w), wt, bias))
        mm = bb.call("matmul", bb.call("reshape", a, shape_of([n, 2, 3])), bb.call("reshape", b, shape_of([n, 3, 2])))
        outs.append(bb.call("reshape", mm, shape_of([n, 4])))
        parts = bb.call("split", a, sizes=(2, 4), axis=1)
        outs.append(bb.call("concat", bb.emit(TupleGetItem(parts, 1)), bb.emit(TupleGetItem(parts, 0)), axis=1))
        emb = bb.call("take", wt, ids)  # (n, 5)
        outs.append(bb.call("concat", emb, bb.call("strided_slice", a, shape_of([5, 6]), axis=1), axis=1))
        outs.append(bb.call("astype", bb.call("arange", shape_of([2, n + 2]), dtype="int32"), dtype="float32"))
        bb.finish(bb.emit(Tuple(tuple(outs)), "all"))
    return bb.module


def test_every_op_matches_its_reference():
    mod = op_zoo()
    source = module_to_python(mod)
    assert "self.call_op" not in source
    py = load_python(source, mod, "host")
    rng = np.random.default_rng(0)
    n = 4
    args = [rng.standard_normal((n, 6)).astype(np.float32), rng.standard_normal((n, 6)).astype(np.float32),
            rng.standard_normal((5, 6)).astype(np.float32), rng.standard_normal(6).astype(np.float32),
            np.array([5, 0, 2, 2], np.int32)]
    want = Interpreter(mod).run("zoo", *args)
    got = py.zoo(*(torch.from_numpy(x) for x in args))
    assert len(got) == len(want)
    for k, (g, w_) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g.numpy(), w_, rtol=1e-5, atol=1e-5, err_msg=f"output {k}")


def test_ops_without_a_torch_form_run_their_reference(monkeypatch):
    mod = op_zoo()
    monkeypatch.delitem(OPS, "gelu_tanh")
    source = module_to_python(mod)
    assert 'self.call_op("gelu_tanh", a)' in source
    py = load_python(source, mod, "host")
    x = np.linspace(-3, 3, 24, dtype=np.float32).reshape(4, 6)
    args = [x, x, np.ones((5, 6), np.float32), np.ones(6, np.float32), np.zeros(4, np.int32)]
    want = Interpreter(mod).run("zoo", *args)
    got = py.zoo(*(torch.from_numpy(a) for a in args))
    np.testing.assert_allclose(got[7].numpy(), want[7], rtol=1e-6)


def test_if_prints_as_python_if():
    x, c = Var("x", Tensor((4,))), Var("c", Tensor((), "bool"))
    bb = BlockBuilder()
    with bb.function("f", [c, x]):
        t = Var("t", Tensor((4,)))
        neg = Call("negative", (x,), {}, Tensor((4,)))
        then_b = SeqExpr((BindingBlock((Binding(t, neg),)),), t)
        bb.finish(bb.emit(If(c, then_b, SeqExpr((), x), ann=Tensor((4,))), "r"))
    text = function_to_python(bb.module["f"])
    assert "    if bool(c):\n        t = -x  # (4,) float32\n        r = t\n    else:\n        r = x\n    return r\n" in text
    py = load_python(module_to_python(bb.module), bb.module)
    a = torch.arange(4, dtype=torch.float32)
    assert torch.equal(py.f(torch.tensor(True), a), -a) and torch.equal(py.f(torch.tensor(False), a), a)


def test_module_source_and_constants(tiny_path):
    model = deploycc.load_model(str(tiny_path))
    mod = export(model)
    source = module_to_python(mod)
    compile(source, "printed", "exec")
    assert source.startswith("# The graph functions of the ") and "class Module(BasePyModule):" in source
    if "apply_rope(" in source:  # rope tables are module constants, set by load_python
        assert "self.const0" in source
        py = load_python(source, mod)
        assert isinstance(py.const0, torch.Tensor) and py.const0.ndim == 1
    with pytest.raises(KeyError, match="not a graph function"):
        module_to_python(mod, ["nope"])


@pytest.mark.parametrize("bits", [8, 16])
def test_round_activations_prints_as_its_reference(bits):
    """The rounding of integer kernels' inputs (op/linalg.py round_activations) as torch: bit for bit the numpy
    reference, blocks of zeros, exact halves and large values included."""
    n = sym.var("n")
    bb = BlockBuilder()
    x = Var("x", Tensor((n, 64)))
    with bb.function("rounded", [x]):
        bb.finish(bb.call("round_activations", x, bits=bits))
    mod = bb.module
    py = load_python(module_to_python(mod), mod, "host")
    rng = np.random.default_rng(bits)
    a = (rng.standard_normal((5, 64)) * rng.choice([1e-3, 1.0, 300.0], (5, 1))).astype(np.float32)
    a[1, :32] = 0.0
    a[2, :4] = [127.0, 0.5, 1.5, -2.5]  # scale 1 for bits 8: ties round to even
    want = Interpreter(mod).run("rounded", a)
    np.testing.assert_array_equal(py.rounded(torch.from_numpy(a)).numpy(), want)
    assert not np.array_equal(want, a)
