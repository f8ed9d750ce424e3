"""Bit operations on packed uint32 words and half-precision storage, rendered for OpenCL (PoCL:
vload_half, no cl_khr_fp16) and WGSL (shader-f16), against the loop-level interpreter (exact for
the integer part, float32 rounding for the rest): the building blocks of quantized weights."""
import numpy as np
import pytest
from conftest import require_device, require_nvcc

from deploycc import presets
from deploycc.ir import tir
from deploycc.ir.tir_interp import run_program
from deploycc.kernel_runner import KernelRunner
from deploycc.schedule import schedule_program


def unpack_program(rows: int, words: int) -> tir.TensorProgram:
    """out[r, 8*w + j] = float((q[r, w] >> 4j) & 15) * float(scale[r]) (a 4-bit dequantize)."""
    Q = tir.Buffer("q", (rows, words), "uint32")
    S = tir.Buffer("scale", (rows,), "float16")
    O = tir.Buffer("out", (rows, words * 8), "float32")
    its = tir.iters("r c", (rows, words * 8))
    r, c = (tir.v(i) for i in its)
    nib = tir.bitwise("bitand", tir.bitwise("shr", Q[r, c // 8], tir.cast("uint32", tir.index((c % 8) * 4))), 15)
    body = tir.Block("unpack", its, tir.Store(O, (r, c), tir.cast("float32", nib) * tir.cast("float32", S[r])))
    return tir.TensorProgram("unpack", (Q, S, O), body)


@pytest.mark.parametrize("preset", ["cpu-opencl", "cpu-webgpu", "h100"])
def test_unpack_nibbles_with_half_scales(preset):
    target = presets.load(preset).target
    device = require_device(target.kind, f16=target.kind == "webgpu")
    prog = unpack_program(5, 3)
    rng = np.random.default_rng(0)
    q = rng.integers(0, 2**32, (5, 3), dtype=np.uint64).astype(np.uint32)
    s = rng.standard_normal(5).astype(np.float16)
    want = [q, s, np.zeros((5, 24), np.float32)]
    run_program(prog, want, [])
    nibbles = (q[:, :, None] >> (np.arange(8) * 4).astype(np.uint32)) & 15
    np.testing.assert_array_equal(want[2], nibbles.reshape(5, 24).astype(np.float32) * s.astype(np.float32)[:, None])
    got = [q, s, np.zeros((5, 24), np.float32)]
    KernelRunner(device, target)(schedule_program(prog, target), got, [])
    np.testing.assert_array_equal(got[2], want[2])


def test_unpack_compiles_for_cuda():
    require_nvcc()
    from deploycc.kernel_runner import render
    from deploycc.runtime.devices.cuda import compile_cuda, ptxas_check

    target = presets.load("h100").target
    kernels = schedule_program(unpack_program(5, 3), target).attrs["schedule"].kernels
    source = render(list(kernels), target)
    assert "__half2float" in source and ">>" in source
    assert set(ptxas_check(compile_cuda(source, "sm_90"), "sm_90")) == {"unpack"}
