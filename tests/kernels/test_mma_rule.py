"""Prefill matmuls on the tensor cores (deploycc/schedule/mma.py): CUDA's warp matrix API with tf32 operands split in
two (3xTF32), run under the CUDA emulation (runtime/devices/cuda_emu.h has nvcuda::wmma), against the loop-level
interpreter and float64.

Checked: the rule takes prefill linears on the preset with tensor cores on (h100; rtx4090's are off: 3xTF32 runs
at a third of its float32 rate there) and nothing else (decode's single row, other targets); edges of every size
(M, N and K not multiples of the 64 x 64 x 32 tiles, K below one tile); a tiny Llama's q4f16_1 linears (4-bit codes
dequantized in the staging, residual adds after); its error against float64 is that of a float32 sum: at most twice
a sequential float32 sum's over K = 2,048, while one tf32 product per multiply-add (the negative control) is 250x
further off (0.053). The emulation's mma rounds its sums toward zero, as the tensor cores do: with the whole K's
hi x hi in one fragment, an H200 measured 1.5e-3 against float's 2.1e-4 and the emulation 1.1e-3 (this test
failed on both); with a fresh fragment each K step added in float, the H200 5.4e-5, the emulation 4.8e-5. The
whole models' kernels and logits under the emulation: tests/kernels/test_model_kernels.py (cuda-emu-h100,
cuda-emu-rtx4090).

The codes' tiles (mma.codes_rule) for 4- and 8-bit weights, on both CUDA presets: every group scheme and GGUF
format against the interpreter at 37 x 256 x 80 (float weights to 3xTF32 instead); over K = 2,048 of q4f16_1
weights within twice a float32 sum's error of float64, x's bfloat16 part alone (the negative control) 1,000x
further; nvcc's registers, spills and shared memory at each K step. GGUF packages through them:
tests/quantization/test_gguf.py.
"""
import numpy as np
import pytest
from conftest import require_cxx, require_device

from deploycc import op, presets  # noqa: F401  (op registers the ops)
from deploycc.ir import BlockBuilder, Tensor, Var, sym
from deploycc.ir.tir_interp import run_program
from deploycc.kernel_runner import KernelRunner
from deploycc.schedule import schedule_program
from deploycc.transform import legalize


@pytest.fixture(scope="module", params=["cuda-emu", "cuda"])
def runner(request):
    """The emulation here; a real GPU where there is one (skipped elsewhere: benchmarks/gpu_check.sh runs it)."""
    if request.param == "cuda":
        return KernelRunner(require_device("cuda"), presets.load("h100").target)
    require_cxx()
    from deploycc.runtime.devices import open_device

    return KernelRunner(open_device("cuda", emulate="shuffle"), presets.load("h100").target)


def program(opname: str, shapes: dict, **attrs):
    bb = BlockBuilder()
    args = [Var(n, Tensor(s)) for n, s in shapes.items()]
    with bb.function("main", args, auto_dataflow=True):
        bb.finish(bb.call(opname, *args, **attrs))
    return legalize(bb.module)[opname]


def linear(k: int, n: int):
    return program("linear", {"x": (sym.var("n"), k), "w": (n, k)})


def run(runner, prog, inputs, out_shape):
    prog = schedule_program(prog, runner.target)
    got = [*inputs, np.zeros(out_shape, np.float32)]
    want = [*inputs, np.zeros(out_shape, np.float32)]
    runner(prog, got, ())
    run_program(prog, want, ())
    return prog, got[-1], want[-1]


def test_the_rule_takes_prefill_linears_on_tensor_core_presets_only():
    # a row count known at run time: the tiles past a few rows, the few-row GEMV below (test_dispatch_rows.py)
    assert schedule_program(linear(64, 32), presets.load("h100").target).attrs["schedule"].rule.endswith("|gemv-rows|mma")
    for preset in ("rtx4090", "adreno", "chrome-webgpu", "cpu"):
        assert "mma" not in schedule_program(linear(64, 32), presets.load(preset).target).attrs["schedule"].rule
    decode = program("linear", {"x": (1, 64), "w": (32, 64)})
    assert schedule_program(decode, presets.load("h100").target).attrs["schedule"].rule == "gemv"
    # 4-bit weights: their codes' products on both CUDA presets' tensor cores (rtx4090 has tf32_tiles off)
    for preset in ("h100", "rtx4090"):
        got = schedule_program(quantized_linear("q4f16_1", 64, 32), presets.load(preset).target)
        assert got.attrs["schedule"].rule.endswith("|gemv-rows|mma-codes"), preset
    for preset in ("adreno", "chrome-webgpu", "cpu"):
        got = schedule_program(quantized_linear("q4f16_1", 64, 32), presets.load(preset).target)
        assert "mma" not in got.attrs["schedule"].rule, preset


@pytest.mark.parametrize("m,k,n", [(9, 32, 16), (17, 64, 16), (70, 96, 130), (64, 40, 64), (129, 8, 65)])
def test_edges(runner, m, k, n):
    rng = np.random.default_rng(m * k + n)
    x, w = rng.standard_normal((m, k), np.float32), rng.standard_normal((n, k), np.float32)
    prog, got, want = run(runner, linear(k, n), [x, w], (m, n))
    assert prog.attrs["schedule"].rule.endswith("|gemv-rows|mma") and "wmma::mma_sync" in runner.sources[prog.name]
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-5)


def run_quantized(runner, prog, rng):
    """A quantized prefill program at 37 rows: random codes, fp16 scales and activations; (scheduled, got, want)."""
    env = {"seq_len": 37}
    shape = lambda b: tuple(int(sym.evaluate(sym.as_expr(d), {v: env[v.name] for v in sym.as_expr(d).free_vars()}))  # noqa: E731
                            for d in b.shape)
    inputs = [rng.integers(0, 2 ** 32, shape(b), np.uint64).astype(np.uint32) if b.dtype == "uint32" else
              (rng.random(shape(b)) * 0.1).astype(np.float16) if b.dtype == "float16" else
              rng.standard_normal(shape(b)).astype(np.float32) for b in prog.inputs]
    return run(runner, prog, inputs, shape(prog.outputs[0]))


def test_dequantized_weights_and_epilogues(runner, quantized_programs):
    rng = np.random.default_rng(0)
    assert len(quantized_programs) >= 4 and any("add" in p.name for p in quantized_programs)
    for prog in quantized_programs:
        scheduled_prog, got, want = run_quantized(runner, prog, rng)
        assert scheduled_prog.attrs["schedule"].rule.endswith("|gemv-rows|mma-codes"), prog.name
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-5, err_msg=prog.name)


def sequential_error(x: np.ndarray, w: np.ndarray, exact: np.ndarray) -> float:
    """The largest error of float32 sums taken one product at a time, as a SIMT kernel's thread takes them."""
    acc = np.zeros(exact.shape, np.float32)
    for j in range(x.shape[1]):
        acc += np.outer(x[:, j], w[:, j])
    return float(np.abs(acc - exact).max())


@pytest.mark.parametrize("split", [True, False])
def test_three_tf32_products_are_as_accurate_as_float32(runner, monkeypatch, split):
    """Over K = 2,048, the 3xTF32 kernel's error against float64 is within twice a sequential float32 sum's; with
    only the hi x hi product (plain tf32: the negative control) it is far outside it."""
    if not split:
        from deploycc.targets.cuda import CUDARenderer

        plain = CUDARenderer.intrin

        def hi_only(self, st):
            lines = plain(self, st)
            return [ln for ln in lines if "_lo[" not in ln] if st.name == "wmma.mma3" else lines
        monkeypatch.setattr(CUDARenderer, "intrin", hi_only)
        runner = KernelRunner(runner.device, runner.target)
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((64, 2048), np.float32), rng.standard_normal((64, 2048), np.float32)
    _, got, _ = run(runner, linear(2048, 64), [x, w], (64, 64))
    exact = x.astype(np.float64) @ w.T.astype(np.float64)
    bound = sequential_error(x, w, exact)
    err = float(np.abs(got - exact).max())
    print(f"3xTF32={split}: {err:.3g} against float32's {bound:.3g}")
    assert (err <= 2 * bound) if split else (err > 10 * bound)


def test_prefetched_k_steps_compute_the_same(runner, quantized_programs, monkeypatch):
    """mma.PREFETCH (the next K step's operands into registers during this step's products; off until a GPU says it
    pays): the edges, the 4-bit weights with their residual adds, and 3xTF32's accuracy over K = 2,048, as above."""
    from deploycc.schedule import mma

    monkeypatch.setattr(mma, "PREFETCH", True)
    runner = KernelRunner(runner.device, runner.target)  # kernels built anew
    rng = np.random.default_rng(3)
    for m, k, n in [(9, 32, 16), (70, 96, 130), (129, 8, 65)]:
        x, w = rng.standard_normal((m, k), np.float32), rng.standard_normal((n, k), np.float32)
        prog, got, want = run(runner, linear(k, n), [x, w], (m, n))
        assert "pa[" in runner.sources[prog.name] and "pb[" in runner.sources[prog.name]
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-5, err_msg=f"{m}x{k}x{n}")
    for prog in quantized_programs:
        _, got, want = run_quantized(runner, prog, rng)
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-5, err_msg=prog.name)
    x, w = rng.standard_normal((64, 2048), np.float32), rng.standard_normal((64, 2048), np.float32)
    _, got, _ = run(runner, linear(2048, 64), [x, w], (64, 64))
    exact = x.astype(np.float64) @ w.T.astype(np.float64)
    assert float(np.abs(got - exact).max()) <= 2 * sequential_error(x, w, exact)


# ---- 4- and 8-bit weights: their codes' products in bfloat16 and half (mma.codes_rule) -----------------------------

# a scale (and a minimum) constant over 32 of K, or over 16 (Q6_K; Q2_K with its minimums), times a small integer:
# every GGUF format and group scheme; and fp16 weights (q0f16), a half value in three exact parts (float32 weights:
# the 3xTF32 tiles, test_edges)
CODES = ["q4f16_1", "q8f16_0", "q4f16_2", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "Q2_K", "Q3_K", "Q4_K",
         "Q5_K", "Q6_K", "IQ4_XS", "q0f16"]


def scheme_of(name: str):
    from deploycc.quantization import BLOCK_SCHEMES
    from deploycc.quantization.schemes import QUANTIZATION

    return QUANTIZATION.get(name) or BLOCK_SCHEMES[name]


def quantized_linear(name: str, k: int, n: int):
    """y[rows, n] = x[rows, k] . W[n, k], W dequantized from `name`'s packed tensors inside the sum (as fused)."""
    from deploycc.ir import tir

    scheme = scheme_of(name)
    bufs, rows = scheme.buffers(n, k), sym.var("seq_len")
    x, y = tir.Buffer("x", (rows, k), "float32"), tir.Buffer("y", (rows, n), "float32")
    its = tir.iters("i j k", (rows, n, k), "SSR")
    i, j, kk = (tir.v(it) for it in its)
    mm = tir.Block("matmul", its, tir.Store(y, (i, j), y[i, j] + x[i, kk] * scheme.value(bufs, j, kk)),
                   init=tir.Store(y, (i, j), tir.const(0.0)))
    return tir.TensorProgram(f"linear_{name}", (*bufs, x, y), mm)


def random_packed(name: str, n: int, k: int, rng) -> list:
    """`name`'s packed tensors of an n x k weight: group schemes quantize random weights; GGUF formats take random
    blocks with f16 scales of 0.01 standard deviation."""
    from deploycc.quantization.gguf_blocks import LAYOUTS

    scheme = scheme_of(name)
    if name in LAYOUTS:
        block, nbytes, fields = LAYOUTS[name]
        raw = rng.integers(0, 256, (n, k // block, nbytes), dtype=np.uint8)
        for _, at, _, kind in fields:
            if kind == "f16":
                d = (rng.standard_normal((n, k // block, 1)) * 0.01).astype(np.float16)
                raw[:, :, at:at + 2] = d.view(np.uint8).reshape(n, k // block, 2)
        packed = scheme.from_blocks(raw.reshape(n, -1))
    else:
        packed = scheme.quantize(rng.standard_normal((n, k)).astype(np.float32))
    return [packed[p] for p in scheme.param_shapes(n, k)]


def codes_case(runner, name: str, m: int, k: int, n: int, rng):
    """`name`'s m x k x n linear on random weights and x through the codes' tiles, within 1e-5 of the largest output
    of the interpreter's; the scheduled program."""
    x = rng.standard_normal((m, k)).astype(np.float32)
    prog, got, want = run(runner, quantized_linear(name, k, n), [*random_packed(name, n, k, rng), x], (m, n))
    assert prog.attrs["schedule"].rule.endswith("|gemv-rows|mma-codes"), name
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()), err_msg=name)
    return prog


def error_over_2048(runner, name: str, rng) -> tuple[float, float]:
    """(the codes' tiles' largest error against float64 over K = 2,048 of `name`'s weights, a sequential float32
    sum's)."""
    x = rng.standard_normal((64, 2048)).astype(np.float32)
    packed = random_packed(name, 64, 2048, rng)
    prog, got, _ = run(runner, quantized_linear(name, 2048, 64), [*packed, x], (64, 64))
    assert prog.attrs["schedule"].rule.endswith("|gemv-rows|mma-codes")
    w = scheme_of(name).dequantize(dict(zip(scheme_of(name).param_shapes(64, 2048), packed)), 2048)
    exact = x.astype(np.float64) @ w.T.astype(np.float64)
    return float(np.abs(got - exact).max()), sequential_error(x, w, exact)


@pytest.mark.parametrize("name", CODES)
def test_codes_rule_takes_scaled_small_integers(runner, name):
    """Weights that are a scale constant over 32 (or 16) of K times an integer within 256, plus a minimum, or a stored
    half, go to the codes rule: against the interpreter at 37 rows, K = 256, N = 80 (edges: a partial row tile and
    column tile), within 1e-5 of the largest output."""
    prog = codes_case(runner, name, 37, 256, 80, np.random.default_rng(len(name)))
    assert "__nv_bfloat16" in runner.sources[prog.name]
    assert ("Bs_r" in runner.sources[prog.name]) == (name == "q0f16")  # a half weight's three parts
    # the kind the schedule records for the performance model: three products where x's sums meet a minimum
    # (q4f16_2, Q4_1, Q5_1, Q2_K, Q4_K, Q5_K) or a half weight is split, else two
    tiles = [k for k in prog.attrs["schedule"].kernels if k.tensor]
    three = "xsum" in runner.sources[prog.name] or name == "q0f16"
    assert [k.tensor for k in tiles] == ["codes3" if three else "codes"], name


@pytest.mark.parametrize("name,k", [("q4f16_1", 96), ("q4f16_1", 40), ("q4f16_2", 96), ("Q8_0", 32)])
def test_codes_tiles_at_ks_not_a_multiple_of_their_step(runner, name, k):
    """K = 96 and 40 against a step of 64 (K = 32 and 96 against 32, with a minimum): the last step's spans past K
    stage zero scales (and minimums) rather than read groups past the weights' (the emulation's bytes past a buffer
    read as NaN, which a product of zero would keep)."""
    codes_case(runner, name, 45, k, 72, np.random.default_rng(k))


@pytest.mark.parametrize("name,split", [("q4f16_1", True), ("q4f16_1", False), ("q0f16", True)])
def test_codes_products_are_as_accurate_as_float32(runner, monkeypatch, name, split):
    """Over K = 2,048 of q4f16_1 weights (and of fp16 ones, in three parts), the codes kernel's error against float64
    (of x and the dequantized weights) is within twice a sequential float32 sum's; with x's bfloat16 part alone (its
    half part's products dropped: the negative control) it is far outside it."""
    if not split:
        from deploycc.targets.cuda import CUDARenderer

        plain = CUDARenderer.intrin

        def hi_only(self, st):
            return [] if st.name == "wmma.mma" and "fa_lo" in st.buffers[1].name else plain(self, st)
        monkeypatch.setattr(CUDARenderer, "intrin", hi_only)
        runner = KernelRunner(runner.device, runner.target)
    err, bound = error_over_2048(runner, name, np.random.default_rng(6))
    print(f"{name}, x in two parts={split}: {err:.3g} against float32's {bound:.3g}")
    assert (err <= 2 * bound) if split else (err > 10 * bound)


@pytest.mark.parametrize("preset", ["h100", "rtx4090"])
def test_codes_tiles_assemble_without_spills(preset):
    """The codes' tiles of 2,048 x 2,048 linears compile with nvcc for the preset's GPU, bfloat16 fragments in their PTX,
    no register spills, at most 168 registers a thread (three blocks of 128 threads an SM by registers) and 48 KiB of
    static shared memory: q4f16_1 and Q5_0 (its 5th bit from another word) at a K step of 64, Q4_K (a minimum: the
    sums of x in two more fragments), Q6_K (scales a 16) and q0f16 (a half weight in three parts) at 32, where their
    scales' rows (or parts) would not fit at 64. ptxas on 2026-11-28, sm_90: 144, 164, 164, 146 and 134 registers;
    48, 48, 33.5, 32.5 and 29 KiB."""
    from conftest import require_nvcc

    from deploycc.kernel_runner import render
    from deploycc.runtime.devices.cuda import compile_cuda, ptxas_check

    require_nvcc()
    target = presets.load(preset).target
    for name, step in (("q4f16_1", 64), ("Q5_0", 64), ("Q4_K", 32), ("Q6_K", 32), ("q0f16", 32)):
        prog = schedule_program(quantized_linear(name, 2048, 2048), target)
        assert prog.attrs["schedule"].rule.endswith("|gemv-rows|mma-codes")
        source = render(list(prog.attrs["schedule"].kernels), target)
        assert f"kt < {2048 // step}" in source, (name, step)  # the K steps
        ptx = compile_cuda(source, target.arch)
        assert "wmma.mma.sync.aligned.row.col.m16n16k16.f32.bf16.bf16.f32" in ptx
        tiles = ptxas_check(ptx, target.arch)[prog.name]
        assert tiles["spill_stores"] == 0 and tiles["registers"] <= 168 and tiles["shared_bytes"] <= 49152, (name, tiles)


def test_prefetched_codes_tiles_compute_the_same(runner, monkeypatch):
    """mma.CODES_PREFETCH (the next K step's x, codes and scales into registers during this step's products; off until
    a GPU says it pays), at both K steps: a scheme of each kind (scales a 32, a minimum, scales a 16, fp16 weights)
    against the interpreter, K not a multiple of the step, and q4f16_1 over K = 2,048 within twice a float32 sum's
    error of float64, as above."""
    from deploycc.schedule import mma

    monkeypatch.setattr(mma, "CODES_PREFETCH", True)
    rng = np.random.default_rng(8)
    for step in (64, 32):
        monkeypatch.setattr(mma, "CODES_K", step)
        fresh = KernelRunner(runner.device, runner.target)  # kernels built anew
        for name, k in (("q4f16_1", 256), ("q4f16_2", 96), ("Q6_K", 256), ("q0f16", 40), ("Q8_0", 32)):
            prog = codes_case(fresh, name, 37, k, 80, rng)
            assert "pa[" in fresh.sources[prog.name], name
    err, bound = error_over_2048(fresh, "q4f16_1", rng)
    assert err <= 2 * bound
