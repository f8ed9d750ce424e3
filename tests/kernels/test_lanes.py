"""Reductions split into a "lanes" loop (schedule/lowering.py) and rendered as OpenCL vector code
(targets/opencl.py): a 4-bit asymmetric dequantize-GEMV with a residual epilogue and an fp16 GEMV,
at every vector width the renderer takes, against the loop-level interpreter on PoCL
(rtol 1e-5: only the summation order differs). Checks that the vector form is really what runs."""
import dataclasses

import numpy as np
import pytest
from conftest import require_device

from deploycc import presets
from deploycc.ir import tir
from deploycc.ir.tir_interp import run_program
from deploycc.kernel_runner import KernelRunner, render
from deploycc.quantization import QUANTIZATION
from deploycc.schedule import schedule_program


def gemv_program(scheme, rows: int, cols: int) -> tir.TensorProgram:
    """out[r] = sum_k x[k] * W[r, k] + res[r], W dequantized from `scheme`'s packed buffers."""
    bufs = scheme.buffers(rows, cols)
    X = tir.Buffer("x", (cols,), "float32")
    R = tir.Buffer("res", (rows,), "float32")
    Y = tir.Buffer("y", (rows,), "float32")
    O = tir.Buffer("out", (rows,), "float32")
    its = tir.iters("r k", (rows, cols), "SR")
    r, k = (tir.v(i) for i in its)
    mm = tir.Block("gemv", its, tir.Store(Y, (r,), Y[r] + X[k] * scheme.value(bufs, r, k)),
                   init=tir.Store(Y, (r,), tir.const(0.0)))
    it2 = tir.iters("r", (rows,))
    add = tir.Block("add", it2, tir.Store(O, (tir.v(it2[0]),), Y[tir.v(it2[0])] + R[tir.v(it2[0])]))
    return tir.TensorProgram("qgemv", (*bufs, X, R, O), tir.Alloc(Y, tir.seq(mm, add)))


@pytest.mark.parametrize("width", [4, 8, 16])
@pytest.mark.parametrize("scheme", ["q4f16_2", "q4f32_1", "q8f16_0", "q0f16"])
def test_vector_lanes_gemv_on_pocl(scheme, width):
    target = dataclasses.replace(presets.load("cpu-opencl").target, vector_width=width)
    device = require_device("opencl")
    s = QUANTIZATION[scheme]
    rows, cols = 37, 96
    prog = gemv_program(s, rows, cols)
    rng = np.random.default_rng(1)
    packed = s.quantize(rng.standard_normal((rows, cols)).astype(np.float32))
    ins = [packed[n] for n in s.param_shapes(rows, cols)]
    x, res = rng.standard_normal(cols).astype(np.float32), rng.standard_normal(rows).astype(np.float32)
    want = [*ins, x, res, np.zeros(rows, np.float32)]
    run_program(prog, want, [])
    np.testing.assert_allclose(want[-1], s.dequantize(packed, cols) @ x + res, rtol=1e-5, atol=1e-5)
    scheduled = schedule_program(prog, target)
    source = render(list(scheduled.attrs["schedule"].kernels), target)
    assert f"float{width} " in source and f"vload{width}(" in source  # x is read as vectors
    got = [*ins, x, res, np.zeros(rows, np.float32)]
    KernelRunner(device, target)(scheduled, got, [])
    np.testing.assert_allclose(got[-1], want[-1], rtol=1e-5, atol=1e-5)


def matmul_program(scheme, rows: int, cols: int) -> tir.TensorProgram:
    """y[m, n] = sum_k x[m, k] * W[n, k], then y[m, n] += b[n] in place (a second block writing the same
    output: a tile's rows past the end must not add the bias twice), m symbolic."""
    from deploycc.ir import sym

    m = sym.SymVar("m")
    bufs = scheme.buffers(rows, cols)
    X = tir.Buffer("x", (m, cols), "float32")
    B = tir.Buffer("b", (rows,), "float32")
    Y = tir.Buffer("y", (m, rows), "float32")
    its = tir.iters("i n k", (m, rows, cols), "SSR")
    i, n, k = (tir.v(it) for it in its)
    mm = tir.Block("mm", its, tir.Store(Y, (i, n), Y[i, n] + X[i, k] * scheme.value(bufs, n, k)),
                   init=tir.Store(Y, (i, n), tir.const(0.0)))
    it2 = tir.iters("i n", (m, rows))
    i2, n2 = (tir.v(it) for it in it2)
    bias = tir.Block("bias", it2, tir.Store(Y, (i2, n2), Y[i2, n2] + B[n2]))
    return tir.TensorProgram("qmm", (*bufs, X, B, Y), tir.seq(mm, bias))


@pytest.mark.parametrize("tile", [(16, 2), (4, 1), (1, 2), (3, 4)])
@pytest.mark.parametrize("m", [1, 5, 17])
def test_register_tiles_on_pocl(tile, m):
    """Row-rule register tiles (row_tile_m x row_tile_n rows per thread, clamped and guarded past the
    end of the symbolic m) against the interpreter (rtol 1e-5)."""
    target = dataclasses.replace(presets.load("cpu-opencl").target, row_tile_m=tile[0], row_tile_n=tile[1])
    device = require_device("opencl")
    s = QUANTIZATION["q4f16_2"]
    rows, cols = 38, 64
    prog = matmul_program(s, rows, cols)
    rng = np.random.default_rng(2)
    packed = s.quantize(rng.standard_normal((rows, cols)).astype(np.float32))
    ins = [packed[n] for n in s.param_shapes(rows, cols)]
    x, b = rng.standard_normal((m, cols)).astype(np.float32), rng.standard_normal(rows).astype(np.float32)
    want = [*ins, x, b, np.zeros((m, rows), np.float32)]
    run_program(prog, want, [m])
    np.testing.assert_allclose(want[-1], x @ s.dequantize(packed, cols).T + b, rtol=1e-5, atol=1e-5)
    scheduled = schedule_program(prog, target)
    source = render(list(scheduled.attrs["schedule"].kernels), target)
    assert ("min(" in source) == (tile[0] > 1 and m > 0)  # the m tile clamps its rows
    got = [*ins, x, b, np.zeros((m, rows), np.float32)]
    KernelRunner(device, target)(scheduled, got, [m])
    np.testing.assert_allclose(got[-1], want[-1], rtol=1e-5, atol=1e-5)
