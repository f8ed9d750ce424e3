"""The tiled matmul rule (shared-memory operand tiles, barriers, tails) on PoCL and lavapipe, with
an inlined dequantize prologue and a residual-add epilogue, at sizes that are not multiples of the
tile. Compared with the loop-level interpreter (atol 1e-4, rtol 1e-4)."""
import numpy as np
import pytest
from conftest import require_device
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
    assert sched.attrs["schedule"].rule == "gemv|matmul"  # n = 1: the few-row GEMV (schedule/dispatch.py)
    rng = np.random.default_rng(n)
    ins = [rng.integers(-8, 8, (16, 8)).astype(np.int32), rng.standard_normal(16).astype(np.float32),
           rng.standard_normal((n, 8)).astype(np.float32), rng.standard_normal((n, 16)).astype(np.float32)]
    want = [*ins, np.zeros((n, 16), np.float32)]
    run_program(prog, want, [])
    got = [*ins, np.zeros((n, 16), np.float32)]
    KernelRunner(device, target)(sched, got, [])
    np.testing.assert_allclose(got[-1], want[-1], atol=1e-4, rtol=1e-4)
