"""Kernels whose buffers reach 2^30 elements compute their indices in 64 bits (targets/cstyle.py WIDE): a
262,144 x 8,192 embedding (2^31 elements, Gemma-sized) overflows 32-bit flat indices near its last rows. The text
check covers CUDA, OpenCL and C; nvcc compiles the CUDA. The wide form's semantics are checked by running a small
lookup rendered wide (the threshold lowered) on PoCL and as native C against the interpreter (exact: a copy)."""
import dataclasses

import numpy as np
import pytest
from conftest import require_device, require_nvcc

from deploycc import op, presets  # noqa: F401  (op registers the ops)
from deploycc.ir import BlockBuilder, Tensor, Var
from deploycc.ir.tir_interp import run_program
from deploycc.kernel_runner import KernelRunner, render
from deploycc.schedule import schedule_program
from deploycc.targets import cstyle
from deploycc.transform import legalize


def kernel_text(kernels, target) -> str:
    """The lookup kernel's own text (the C target's source starts with its intrinsics, which index in 64 bits)."""
    text = render(list(kernels), target)
    start = text.index("void take(")
    return text[start:text.index("\n}\n", start)]


def lookup(rows: int, cols: int, n: int = 3):
    bb = BlockBuilder()
    table, ids = Var("table", Tensor((rows, cols))), Var("ids", Tensor((n,), "int32"))
    with bb.function("main", [table, ids], auto_dataflow=True):
        bb.finish(bb.call("take", table, ids))
    return legalize(bb.module)["take"]


@pytest.mark.parametrize("preset, wide", [("h100", "(long long)"), ("adreno", "(long)"), ("cpu", "(int64_t)")])
def test_a_gemma_sized_embedding_is_indexed_in_64_bits(preset, wide):
    target = presets.load(preset).target
    big = schedule_program(lookup(262_144, 8_192), target).attrs["schedule"].kernels
    small = schedule_program(lookup(1_000, 64), target).attrs["schedule"].kernels
    text = kernel_text(big, target)
    assert f"({wide}(ids[" in text  # the row index read from memory, widened before it is scaled by 8,192
    assert wide in text.split("ids[")[0]  # and the thread's own position
    assert wide not in kernel_text(small, target)  # the others keep 32-bit arithmetic


def test_the_wide_cuda_compiles():
    require_nvcc()
    from deploycc.runtime.devices.cuda import compile_cuda

    target = presets.load("h100").target
    kernels = schedule_program(lookup(262_144, 8_192), target).attrs["schedule"].kernels
    assert ".entry" in compile_cuda(render(list(kernels), target))


@pytest.mark.parametrize("kind, preset", [("opencl", "adreno"), ("cpu", "cpu")])
def test_the_wide_form_computes_the_same(kind, preset, monkeypatch):
    device = require_device(kind)
    target = presets.load(preset).target
    if kind == "opencl":
        target = dataclasses.replace(target, kind="opencl")
    monkeypatch.setattr(cstyle, "WIDE", 64)  # every buffer here is "wide"
    prog = schedule_program(lookup(37, 24, 5), target)
    assert ("(long)" if kind == "opencl" else "(int64_t)") in kernel_text(prog.attrs["schedule"].kernels, target)
    rng = np.random.default_rng(0)
    table, ids = rng.standard_normal((37, 24)).astype(np.float32), np.array([36, 0, 5, 36, 17], np.int32)
    want = [table, ids, np.zeros((5, 24), np.float32)]
    run_program(prog, want, [])
    got = [table, ids, np.zeros((5, 24), np.float32)]
    KernelRunner(device, target)(prog, got, [])
    np.testing.assert_array_equal(got[-1], want[-1])
    np.testing.assert_array_equal(got[-1], table[ids])
