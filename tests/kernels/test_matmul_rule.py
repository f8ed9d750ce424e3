"""The tiled matmul rule (64 x 64 shared-memory operand tiles, 4 x 4 outputs a thread, barriers, tails) on PoCL and
lavapipe, with an inlined dequantize prologue and a residual-add epilogue, at sizes that are not multiples of the
tile (n = 1 takes the few-row GEMV: schedule/dispatch.py). Compared with the loop-level interpreter (atol 1e-4, rtol
1e-4); bigger shapes under the CUDA emulation: tests/kernels/test_model_kernels.py (rtx4090) and
tests/kernels/test_dispatch_rows.py (rtx4090, adreno, cpu-webgpu: edges of 9 rows)."""
import numpy as np
import pytest
from conftest import require_cxx, require_device
from transform.test_fusion_text import module

from deploycc import presets
from deploycc.ir.tir_interp import run_program
from deploycc.kernel_runner import KernelRunner
from deploycc.schedule import schedule_program
from deploycc.transform.annotate_patterns import annotate_patterns
from deploycc.transform.fuse_ops import fuse_ops
from deploycc.transform.fuse_tensor import fuse_tensor

# adreno: an OpenCL GPU preset with tiling on (cpu-opencl turns it off), run here on PoCL.
PRESETS = {"opencl": "adreno", "webgpu": "cpu-webgpu"}


@pytest.mark.parametrize("kind", sorted(PRESETS))
@pytest.mark.parametrize("n", [1, 17, 40])
def test_tiled_matmul_with_prologue_and_epilogue(kind, n):
    device = require_device(kind)
    target = presets.load(PRESETS[kind]).target
    fused = fuse_tensor(fuse_ops(annotate_patterns(module())))
    prog = fused["fused_dequantize_linear_add"]
    sched = schedule_program(prog, target)
    assert sched.attrs["schedule"].rule.endswith("|gemv-rows|matmul")  # n = 1: the one-row GEMV (schedule/dispatch.py)
    rng = np.random.default_rng(n)
    ins = [rng.integers(-8, 8, (16, 8)).astype(np.int32), rng.standard_normal(16).astype(np.float32),
           rng.standard_normal((n, 8)).astype(np.float32), rng.standard_normal((n, 16)).astype(np.float32)]
    want = [*ins, np.zeros((n, 16), np.float32)]
    run_program(prog, want, [])
    got = [*ins, np.zeros((n, 16), np.float32)]
    KernelRunner(device, target)(sched, got, [])
    np.testing.assert_allclose(got[-1], want[-1], atol=1e-4, rtol=1e-4)


EDGE_BACKENDS = {"opencl": "adreno", "webgpu": "cpu-webgpu", "cuda-emu": "rtx4090"}


@pytest.mark.parametrize("kind", sorted(EDGE_BACKENDS))
def test_tile_edges(kind):
    """Several 64 x 64 tiles with tails in M, N and K (M = 70, 129; N = 130, 65; K = 40, 8 and 100) and a tile-sized
    case, a linear without prologue (its weights float32): against the interpreter."""
    from deploycc.ir import BlockBuilder, Tensor, Var, sym
    from deploycc.transform import legalize

    if kind == "cuda-emu":
        require_cxx()
        from deploycc.runtime.devices import open_device

        device = open_device("cuda", emulate="shuffle")
    else:
        device = require_device(kind)
    target = presets.load(EDGE_BACKENDS[kind]).target
    runner = KernelRunner(device, target)
    for m, k, n in [(70, 40, 130), (129, 8, 65), (64, 100, 64)]:
        bb = BlockBuilder()
        args = [Var("x", Tensor((sym.var("n"), k))), Var("w", Tensor((n, k)))]
        with bb.function("main", args, auto_dataflow=True):
            bb.finish(bb.call("linear", *args))
        prog = schedule_program(legalize(bb.module)["linear"], target)
        assert prog.attrs["schedule"].rule.endswith("|gemv-rows|matmul")
        rng = np.random.default_rng(m + k + n)
        ins = [rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((n, k)).astype(np.float32)]
        got, want = [*ins, np.zeros((m, n), np.float32)], [*ins, np.zeros((m, n), np.float32)]
        runner(prog, got, [])
        run_program(prog, want, [])
        np.testing.assert_allclose(got[-1], want[-1], atol=1e-4, rtol=1e-4, err_msg=f"{m} x {k} x {n}")
