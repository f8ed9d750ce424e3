"""WGSL's sin and cos are reduced modulo 2 pi before the builtin (targets/wgsl.py): WGSL bounds their error only
on [-pi, pi], and the hardware sine of NVIDIA's Vulkan driver drifted with the argument (rope_table2 1.7e-5 off at
45 rad on an H100, where lavapipe's libm was exact). The reduction is held here on lavapipe to the float64 sine of
the same float32 angles, up to 4e5 rad (rope angles of a 131,072-token context and past): 1e-6 absolute."""
import numpy as np
import pytest
from conftest import require_device

from deploycc import presets
from deploycc.ir import tir
from deploycc.ir.kernel import scheduled
from deploycc.kernel_runner import KernelRunner
from deploycc.schedule import schedule_program
from deploycc.targets.wgsl import render


def trig_program(n: int, op: str) -> tir.TensorProgram:
    X = tir.Buffer("x", (n,), "float32")
    O = tir.Buffer("out", (n,), "float32")
    its = tir.iters("i", (n,))
    i = tir.v(its[0])
    return tir.TensorProgram(op, (X, O), tir.Block(op, its, tir.Store(O, (i,), tir.unary(op, X[i]))))


@pytest.mark.parametrize("op", ["sin", "cos"])
def test_large_angles_are_reduced_and_exact(op):
    device = require_device("webgpu")
    target = presets.load("cpu-webgpu").target
    x = np.concatenate([np.linspace(-7, 7, 1001), np.arange(0, 131072, 37.3), [131071.0, 4e5, -4e5],
                        np.float32(np.arange(4096)) * np.float32(0.9)]).astype(np.float32)
    prog = schedule_program(trig_program(len(x), op), target)
    source = render(list(scheduled(prog).kernels), target)
    assert f"{op}((" in source and "round(" in source and "6.28125" in source, source
    got = [x, np.zeros_like(x)]
    KernelRunner(device, target)(prog, got, [])
    want = getattr(np, op)(x.astype(np.float64))
    err = np.abs(got[1] - want)
    assert err.max() < 1e-6, (float(err.max()), float(x[err.argmax()]))
