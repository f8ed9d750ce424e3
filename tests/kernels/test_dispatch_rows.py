"""Matmuls whose row count is known only at run time (schedule/dispatch.py): the decode GEMV (gemv.rule, the program at
one row) for M = 1, the few-row GEMV (gemv.few_rows) in work-groups of SMALL rows for 1 < M <= SMALL and of FEW rows
for SMALL < M <= MANY, and the prefill tiles above, chosen per launch by work-group counts that are zero outside each
kernel's range.

Checked: which presets take the rule (the GPU ones; CPU presets and a constant row count keep their one kernel); the
work-group counts at every M up to twice MANY; the kernels against the loop-level interpreter at M = 1..FEW + 1 (one
and two chunks of rows) and MANY - 1..MANY + 1 on the CUDA emulation (h100: the tiles are tensor-core ones; rtx4090:
SIMT tiles), lavapipe (cpu-webgpu) and PoCL (adreno), with exactly one kernel launched per run, the one for that M,
a long K taken in slices by all three GEMVs among the shapes;
a tiny Llama's q4f16_1 linears (4-bit codes dequantized in registers, residual adds) at M = 1, 3, 5, 8, 13 and MANY;
negative controls: the few-row kernel launched with one chunk's work-groups at M = FEW + 3 leaves the rows past FEW
unmade, the one-row kernel launched at M = 2 makes row 0 and not row 1, and the few-row GEMVs' slices of K without
their barrier make wrong rows.
Tolerance: atol 1e-4 + rtol 1e-5 (float32 sums of up to 130 products in another order). Whole models:
tests/kernels/test_model_kernels.py's prefill of 1 token takes the one-row kernels, of 5 the few-row ones, of 64 the
tiles;
tests/runtime/test_batch.py's batched steps take them on lavapipe and the emulation.
"""
import numpy as np
import pytest
from conftest import require_cxx, require_device

from deploycc import op, presets  # noqa: F401  (op registers the ops)
from deploycc.ir import BlockBuilder, Tensor, Var, sym
from deploycc.ir.tir_interp import run_program
from deploycc.kernel_runner import KernelRunner
from deploycc.schedule import dispatch, gemv, schedule_program
from deploycc.transform import legalize

FEW, MANY, SMALL = gemv.FEW, gemv.MANY, dispatch.SMALL
NAMES = ["linear_one", f"linear_rows{SMALL}", "linear_rows", "linear"]


def chosen(m: int) -> str:
    """The kernel of M rows' range (NAMES' order)."""
    return NAMES[0 if m == 1 else 1 if m <= SMALL else 2 if m <= MANY else 3]


BACKENDS = {"cuda-h100": "h100", "cuda-rtx4090": "rtx4090", "webgpu": "cpu-webgpu", "opencl": "adreno",
            "cuda-gpu": "h100"}  # the last on an NVIDIA GPU where there is one (benchmarks/gpu_check.sh)


@pytest.fixture(scope="module", params=sorted(BACKENDS))
def runner(request):
    kind = request.param.split("-")[0]
    if request.param == "cuda-gpu":
        device = require_device("cuda")
    elif kind == "cuda":
        require_cxx()
        from deploycc.runtime.devices import open_device

        device = open_device("cuda", emulate="shuffle")
    else:
        device = require_device(kind)
    return KernelRunner(device, presets.load(BACKENDS[request.param]).target)


def linear(k: int, n: int, rows=None):
    bb = BlockBuilder()
    args = [Var("x", Tensor((rows or sym.var("n"), k))), Var("w", Tensor((n, k)))]
    with bb.function("main", args, auto_dataflow=True):
        bb.finish(bb.call("linear", *args))
    return legalize(bb.module)["linear"]


def run(runner, prog, inputs, out_shape):
    """(the program scheduled, the kernels' output, the interpreter's, kernels launched). Schedule the program before
    (once: the runner builds each scheduled program's kernels once) to run it at several row counts."""
    if "schedule" not in prog.attrs:
        prog = schedule_program(prog, runner.target)
    got = [*inputs, np.zeros(out_shape, np.float32)]
    want = [*inputs, np.zeros(out_shape, np.float32)]
    before = runner.launches
    runner(prog, got, ())
    run_program(prog, want, ())
    return prog, got[-1], want[-1], runner.launches - before


def test_gpu_presets_take_it_and_cpu_presets_do_not():
    tiles = {"h100": "mma", "rtx4090": "matmul", "adreno": "matmul", "chrome-webgpu": "matmul", "cpu-webgpu": "matmul"}
    for preset, tile in tiles.items():
        s = schedule_program(linear(64, 32), presets.load(preset).target).attrs["schedule"]
        assert s.rule == f"gemv|gemv-rows|gemv-rows|{tile}" and s.dispatched, preset
        assert [k.name for k in s.kernels] == NAMES
    for preset in ("cpu", "cpu-avx2", "cpu-opencl"):
        s = schedule_program(linear(64, 32), presets.load(preset).target).attrs["schedule"]
        assert not s.dispatched and len(s.kernels) == 1, preset
    h100 = presets.load("h100").target
    assert schedule_program(linear(64, 32, 1), h100).attrs["schedule"].rule == "gemv"  # decode
    assert schedule_program(linear(64, 32, 64), h100).attrs["schedule"].rule == "mma"  # a constant 64 rows


def test_work_groups_are_zero_outside_each_kernels_range():
    s = schedule_program(linear(64, 130), presets.load("h100").target).attrs["schedule"]
    one, small, few, tiles = s.kernels
    n = next(iter(sym.as_expr(few.groups).free_vars()))
    for m in range(1, 2 * MANY):
        g_one, g_small, g_few, g_tiles = (int(sym.evaluate(k.groups, {n: m})) for k in (one, small, few, tiles))
        assert [g > 0 for g in (g_one, g_small, g_few, g_tiles)] == [k.name == chosen(m) for k in s.kernels], m
        assert g_one in (0, -(-130 // 8)) and g_small in (0, -(-130 // 8) * -(-m // SMALL))
        assert g_few in (0, -(-130 // 8) * -(-m // FEW)) and g_tiles in (0, -(-m // 64) * -(-130 // 64))
    assert dispatch.at_most(sym.as_expr(n), MANY) != dispatch.above(sym.as_expr(n), MANY)


@pytest.mark.parametrize("k,n", [(64, 16), (96, 130), (40, 65), (2048, 24)])
def test_every_row_count_around_the_threshold(runner, k, n):
    """(2048, 24): few columns and a long K, which the GEMVs take in slices of K (work-groups of T x S threads)."""
    rng = np.random.default_rng(k + n)
    prog = schedule_program(linear(k, n), runner.target)
    sliced = [kern.threads > 64 for kern in prog.attrs["schedule"].kernels[:3]]
    assert sliced == [k == 2048] * 3, sliced
    for m in (*range(1, FEW + 2), MANY - 1, MANY, MANY + 1):
        x, w = rng.standard_normal((m, k), np.float32), rng.standard_normal((n, k), np.float32)
        prog, got, want, launched = run(runner, prog, [x, w], (m, n))
        assert launched == 1, (m, launched)
        assert runner.launched[-1] == chosen(m), m
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-5, err_msg=f"M={m}")
    assert all(name in runner.sources[prog.name] for name in NAMES)


def test_dequantized_weights_and_epilogues(runner, quantized_programs):
    rng = np.random.default_rng(0)
    assert len(quantized_programs) >= 4 and any("add" in p.name for p in quantized_programs)
    for prog in quantized_programs:
        prog = schedule_program(prog, runner.target)
        for m in (1, 3, SMALL + 1, FEW, FEW + 5, MANY):
            def shape(b):
                return tuple(int(sym.evaluate(sym.as_expr(d), {v: m for v in sym.as_expr(d).free_vars()}))
                             for d in b.shape)
            inputs = [rng.integers(0, 2 ** 32, shape(b), np.uint64).astype(np.uint32) if b.dtype == "uint32" else
                      (rng.random(shape(b)) * 0.1).astype(np.float16) if b.dtype == "float16" else
                      rng.standard_normal(shape(b)).astype(np.float32) for b in prog.inputs]
            scheduled, got, want, launched = run(runner, prog, inputs, shape(prog.outputs[0]))
            assert scheduled.attrs["schedule"].dispatched and launched == 1, prog.name
            assert runner.launched[-1] == chosen(m).replace("linear", prog.name), (prog.name, m)
            np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-5, err_msg=f"{prog.name} M={m}")


def test_the_few_row_kernel_needs_its_chunks_of_rows():
    """The negative control: launched with one chunk's work-groups (the columns', as before chunks), M = FEW + 3 leaves
    the last three rows as they were (zeros), so the chunks are what make the rows past FEW."""
    require_cxx()
    from dataclasses import replace

    from deploycc.runtime.devices import open_device

    runner = KernelRunner(open_device("cuda", emulate="forward"), presets.load("h100").target)
    rng = np.random.default_rng(1)
    m = FEW + 3
    x, w = rng.standard_normal((m, 64), np.float32), rng.standard_normal((16, 64), np.float32)
    prog = schedule_program(linear(64, 16), runner.target)
    s = prog.attrs["schedule"]
    few = s.kernels[2]
    n = next(iter(sym.as_expr(few.groups).free_vars()))
    assert int(sym.evaluate(few.groups, {n: m})) == 2 * -(-16 // 8)  # two chunks of rows
    one_chunk = replace(few, groups=sym.as_expr(-(-16 // 8)))
    prog.attrs["schedule"] = replace(s, kernels=(*s.kernels[:2], one_chunk, *s.kernels[3:]))
    _, got, want, launched = run(runner, prog, [x, w], (m, 16))
    assert launched == 1
    np.testing.assert_allclose(got[:FEW], want[:FEW], atol=1e-4, rtol=1e-5)
    assert np.all(got[FEW:] == 0) and np.abs(want[FEW:]).max() > 1


def test_the_one_row_kernel_makes_row_zero_only():
    """The negative control of the one-row kernel's range: launched alone at M = 2 (its work-groups as at M = 1, the
    others' none), it makes row 0 as the interpreter does and leaves row 1 unmade, so the dispatch to the few-row
    kernel is what makes M = 2 right."""
    require_cxx()
    from dataclasses import replace

    from deploycc.runtime.devices import open_device

    runner = KernelRunner(open_device("cuda", emulate="forward"), presets.load("h100").target)
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((2, 64), np.float32), rng.standard_normal((16, 64), np.float32)
    prog = schedule_program(linear(64, 16), runner.target)
    s = prog.attrs["schedule"]
    one = s.kernels[0]
    n = next(iter(sym.as_expr(one.groups).free_vars()))
    alone = (replace(one, groups=sym.as_expr(int(sym.evaluate(one.groups, {n: 1})))),
             *(replace(k, groups=sym.as_expr(0)) for k in s.kernels[1:]))
    prog.attrs["schedule"] = replace(s, kernels=alone)
    _, got, want, launched = run(runner, prog, [x, w], (2, 16))
    assert launched == 1 and runner.launched == ["linear_one"]
    np.testing.assert_allclose(got[0], want[0], atol=1e-4, rtol=1e-5)
    assert np.all(got[1] == 0) and np.abs(want[1]).max() > 1


def test_the_few_row_slices_meet_after_their_barrier(monkeypatch):
    """Negative control of the few-row GEMV's slices of K (a long K, few columns): without the barrier between the
    slices' stores of their sums and slice 0's reads of them, the emulation's shuffled order and poisoned shared
    memory make the rows wrong; with it they are right (M = 3: chunks of SMALL; M = 6: of FEW)."""
    require_cxx()
    from deploycc.runtime.devices import open_device
    from deploycc.targets.cuda import CUDARenderer

    rng = np.random.default_rng(3)
    w = rng.standard_normal((24, 2048), np.float32)
    for barrier in (True, False):
        if not barrier:
            monkeypatch.setattr(CUDARenderer, "barrier", "")
        runner = KernelRunner(open_device("cuda", emulate="shuffle"), presets.load("h100").target)
        prog = schedule_program(linear(2048, 24), runner.target)
        for m in (3, 6):
            x = rng.standard_normal((m, 2048), np.float32)
            _, got, want, launched = run(runner, prog, [x, w], (m, 24))
            assert runner.launched[-1] == chosen(m) and launched == 1
            assert np.allclose(got, want, atol=1e-3) == barrier, (m, barrier)
