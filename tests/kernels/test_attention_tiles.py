"""Prefill attention in tiles of 16 queries with the keys staged in shared memory (deploycc/schedule/attention_tiles.py)
on the GPU presets: the CUDA emulation (h100, threads in shuffled order), lavapipe (cpu-webgpu) and PoCL (adreno),
against attention_reference (numpy) at atol 1e-5 (float32 sums of up to 128 products, an online softmax in
another order, the devices' own exp).

Checked: which programs take it (prefill on the GPU presets; decode and the page pool keep the split form, the CPU
presets their own); several query tiles and key tiles with tails (n, keys not multiples of 16 and 32), cached
positions before the prompt, grouped-query ratios 1 to 4, head_dim 32, 64 and 128 (16 keys a tile where 32 do not
fit lavapipe's 32 KiB), a sliding window starting mid-tile, a score cap, a ring cache; the key tile the shared
memory allows; negative controls under the emulation: each of the three barriers of a key tile deleted in turn gives
a wrong result (shared memory is poisoned before each block). Whole models: tests/kernels/test_model_kernels.py.

Over a float16 cache on the CUDA presets the tiles are the tensor cores' (deploycc/schedule/attention_mma.py):
the same cases and head_dim 256 against the reference on the same half keys and values at atol 1e-5, which presets
and programs take them, and negative controls (either barrier, each warp sync, the second half of q or of p).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import require_cxx, require_device

from deploycc import presets
from deploycc.ir.kernel import Schedule
from deploycc.ir.tir import Alloc, Barrier, For, IfThenElse, Intrin, Seq, TensorProgram, walk
from deploycc.kernel_runner import KernelRunner
from deploycc.op.attention import attention_reference
from deploycc.schedule import attention_tiles, schedule_program
from kernels.test_cpu_attention import attention_program

BACKENDS = {"cuda-emu": "h100", "webgpu": "cpu-webgpu", "opencl": "adreno"}


@pytest.fixture(scope="module", params=sorted(BACKENDS))
def runner(request):
    if request.param == "cuda-emu":
        require_cxx()
        from deploycc.runtime.devices import open_device

        device = open_device("cuda", emulate="shuffle")
    else:
        device = require_device(request.param)
    return KernelRunner(device, presets.load(BACKENDS[request.param]).target)


def test_prefill_on_gpu_presets_takes_the_tiles():
    for preset in ("h100", "rtx4090", "adreno", "cpu-webgpu", "chrome-webgpu"):
        target = presets.load(preset).target
        assert schedule_program(attention_program(7, 4, 2, 64, 0.125), target).attrs["schedule"].rule == "attention-tiles"
        assert schedule_program(attention_program(1, 4, 2, 64, 0.125), target).attrs["schedule"].rule == "attention-split"
    for preset in ("cpu", "cpu-opencl"):
        assert schedule_program(attention_program(7, 4, 2, 64, 0.125), presets.load(preset).target).attrs[
            "schedule"].rule == "attention"
    h100, webgpu = presets.load("h100").target, presets.load("cpu-webgpu").target
    assert [attention_tiles.key_tile(h100, d) for d in (64, 128, 256)] == [32, 32, 0]  # 256: the split form
    assert [attention_tiles.key_tile(webgpu, d) for d in (64, 128)] == [32, 16]
    assert schedule_program(attention_program(7, 4, 2, 256, 0.125), h100).attrs["schedule"].rule == "attention"


CASES = [  # n, keys, heads, kv heads, head_dim, window, cap, ring
    (40, 40, 4, 1, 64, 0, 0.0, 0),      # three query tiles (the last of 8), two key tiles, GQA 4
    (17, 100, 3, 3, 32, 0, 0.0, 0),     # 83 cached positions: four key tiles and a tail
    (33, 70, 4, 2, 128, 0, 0.0, 0),     # head_dim 128 (16 keys a tile on lavapipe)
    (48, 80, 2, 1, 64, 21, 0.0, 0),     # a window of 21 starting mid-tile
    (20, 20, 2, 2, 32, 0, 2.0, 0),      # scores capped at 2
    (7, 40, 6, 3, 32, 20, 2.0, 26),     # a ring of window + 6 rows, wrapped
]


def run(runner, prog, n, total, h, kvh, d, ring, seed=0):
    rng = np.random.default_rng(seed + n * 1000 + total)
    q = (rng.standard_normal((n, h, d)) * 2).astype(np.float32)  # scores of several units: the maximum moves
    k = rng.standard_normal((total, kvh, d)).astype(np.float32)
    v = rng.standard_normal((total, kvh, d)).astype(np.float32)
    out = np.zeros((n, h, d), np.float32)
    if ring:
        kr, vr = (rng.standard_normal((ring, kvh, d)).astype(np.float32) * 1e3 for _ in range(2))
        for j in range(max(0, total - ring), total):
            kr[j % ring], vr[j % ring] = k[j], v[j]
        runner(prog, [q, kr, vr, out], [total])
    else:
        runner(prog, [q, k, v, out], [total])
    return out, q, k, v


@pytest.mark.parametrize("n,total,h,kvh,d,window,cap,ring", CASES)
def test_tiles_match_the_reference(runner, n, total, h, kvh, d, window, cap, ring):
    attrs = {"window": window, **({"softcap": cap} if cap else {})}
    prog = schedule_program(attention_program(n, h, kvh, d, 0.125, ring, **attrs), runner.target)
    assert prog.attrs["schedule"].rule == "attention-tiles"
    out, q, k, v = run(runner, prog, n, total, h, kvh, d, ring)
    want = attention_reference(q, k, v, 0.125, window=window, softcap=cap)
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-5)


def without(stmt, drop):
    """`stmt` without the statements of its sequences that drop(x) selects, asked in program order."""
    def visit(s):
        if isinstance(s, Seq):
            return Seq(tuple(visit(x) for x in s.stmts if not drop(x)))
        if isinstance(s, (For, Alloc)):
            return dataclasses.replace(s, body=visit(s.body))
        if isinstance(s, IfThenElse):
            return dataclasses.replace(s, then_body=visit(s.then_body),
                                       else_body=None if s.else_body is None else visit(s.else_body))
        return s
    return visit(stmt)


def without_barrier(stmt, which: int):
    """`stmt` with its `which`-th Barrier (in program order) removed."""
    seen = [0]

    def drop(x) -> bool:
        if not isinstance(x, Barrier):
            return False
        seen[0] += 1
        return seen[0] - 1 == which
    return without(stmt, drop)


@pytest.mark.parametrize("which", [0, 1, 2])
def test_each_barrier_is_needed(which):
    """Negative controls: the staged keys read before all were written (0), the scores before all were made (1), the
    next tile staged over values still being read (2): under the emulation in forward order each gives wrong output."""
    require_cxx()
    from deploycc.runtime.devices import open_device

    runner = KernelRunner(open_device("cuda", emulate="forward"), presets.load("h100").target)
    n, total, h, kvh, d = 40, 70, 2, 1, 64
    prog = schedule_program(attention_program(n, h, kvh, d, 0.125), runner.target)
    s = prog.attrs["schedule"]
    (k,) = s.kernels
    broken = dataclasses.replace(k, body=without_barrier(k.body, which))
    assert sum(isinstance(x, Barrier) for x in walk(broken.body)) == 2
    prog = TensorProgram(prog.name, prog.params, prog.body, prog.sym_params, prog.num_outputs,
                         {**prog.attrs, "schedule": Schedule((broken,), s.workspace, s.rule)})
    out, q, kk, v = run(runner, prog, n, total, h, kvh, d, 0)
    want = attention_reference(q, kk, v, 0.125)
    assert not np.allclose(out, want, rtol=0, atol=1e-3)



# ---- on the tensor cores (schedule/attention_mma.py): CUDA with a float16 cache ------------------------------------

def mma_runner(order: str = "shuffle") -> KernelRunner:
    require_cxx()
    from deploycc.runtime.devices import open_device

    return KernelRunner(open_device("cuda", emulate=order), presets.load("h100").target)


def run_half(runner, prog, n, total, h, kvh, d, ring, window=0, cap=0.0, seed=0):
    """run()'s case with the keys and values as a float16 cache holds them: (the kernel's output, the reference's)."""
    rng = np.random.default_rng(seed + n * 1000 + total)
    q = (rng.standard_normal((n, h, d)) * 2).astype(np.float32)
    k, v = (rng.standard_normal((total, kvh, d)).astype(np.float16) for _ in range(2))
    out = np.zeros((n, h, d), np.float32)
    if ring:
        kr, vr = (np.full((ring, kvh, d), 1e3, np.float16) for _ in range(2))
        for j in range(max(0, total - ring), total):
            kr[j % ring], vr[j % ring] = k[j], v[j]
        runner(prog, [q, kr, vr, out], [total])
    else:
        runner(prog, [q, k, v, out], [total])
    return out, attention_reference(q, k.astype(np.float32), v.astype(np.float32), 0.125, window=window, softcap=cap)


def test_prefill_over_a_half_cache_takes_the_tensor_cores():
    from deploycc.schedule import attention_mma

    for preset in ("h100", "rtx4090"):
        target = presets.load(preset).target
        rule = lambda n, d, kv="float16": schedule_program(  # noqa: E731
            attention_program(n, 4, 2, d, 0.125, kv=kv), target).attrs["schedule"].rule
        assert [rule(7, d) for d in (32, 64, 128)] == ["attention-mma"] * 3
        assert rule(7, 64, "float32") == "attention-tiles" and rule(1, 64) == "attention-split"
        assert rule(7, 40) == "attention-tiles"  # head_dim not a multiple of 16
        # rows of 16 queries a block and keys a tile; at 256 each row takes two warps (attention_mma.PART)
        assert [attention_mma.shape(target, d) for d in (64, 128, 256)] == [(4, 32), (2, 32), (1, 16)]
        assert [attention_mma.parts(d) for d in (64, 128, 256)] == [1, 1, 2] and rule(7, 256) == "attention-mma"
    assert schedule_program(attention_program(7, 4, 2, 64, 0.125, kv="float16"), presets.load("adreno").target).attrs[
        "schedule"].rule == "attention-tiles"  # OpenCL: the SIMT tiles


MMA_CASES = CASES + [
    (20, 52, 2, 1, 256, 0, 0.0, 0),     # head_dim 256: two warps a row of 16 queries, each half the output
    (24, 60, 4, 2, 256, 20, 50.0, 0),   # ... with Gemma 2's window and cap
]


@pytest.mark.parametrize("backend", ["cuda-emu", "cuda"])
@pytest.mark.parametrize("n,total,h,kvh,d,window,cap,ring", MMA_CASES)
def test_tensor_core_tiles_match_the_reference(backend, n, total, h, kvh, d, window, cap, ring):
    """The cases above and head_dim 256 over a float16 cache, in shuffled thread order (and on a GPU where there is
    one): within 1e-5 of the reference on the same half keys and values (measured at most 3.1e-6 under the
    emulation)."""
    runner = mma_runner() if backend == "cuda-emu" else KernelRunner(require_device("cuda"),
                                                                     presets.load("h100").target)
    attrs = {"window": window, **({"softcap": cap} if cap else {})}
    prog = schedule_program(attention_program(n, h, kvh, d, 0.125, ring, kv="float16", **attrs), runner.target)
    assert prog.attrs["schedule"].rule == "attention-mma"
    assert [k.tensor for k in prog.attrs["schedule"].kernels] == ["attention"]
    out, want = run_half(runner, prog, n, total, h, kvh, d, ring, window, cap)
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-5)


def without_intrin(stmt, which):
    """`stmt` without the Intrin statements `which` selects."""
    return without(stmt, lambda x: isinstance(x, Intrin) and which(x))


def broken(prog, body) -> TensorProgram:
    s = prog.attrs["schedule"]
    k = dataclasses.replace(s.kernels[0], body=body)
    return TensorProgram(prog.name, prog.params, prog.body, prog.sym_params, prog.num_outputs,
                         {**prog.attrs, "schedule": Schedule((k,), s.workspace, s.rule)})


@pytest.mark.parametrize("control", ["barrier 0", "barrier 1", "warp.sync 0", "warp.sync 1", "warp.sync 2",
                                     "the queries' half part", "the probabilities' half part"])
def test_what_the_tensor_core_tiles_need(control):
    """Negative controls (forward thread order; shared memory poisoned before each block; each warp runs on alone
    between barriers): without either barrier of a key tile, or any of the softmax's three warp syncs (a row's two
    lanes exchange their partial maxima and sums, and alpha overwrites the scores) the output is outside 1e-3 of the
    reference; with the second half of q or of p dropped from the products (the scores or the weights to 11 bits) it
    is 50x and more outside the 1e-5 the tiles are held to: the reason for both parts."""
    runner = mma_runner("forward")
    n, total, h, kvh, d = 40, 70, 2, 1, 64
    prog = schedule_program(attention_program(n, h, kvh, d, 0.125, kv="float16"), runner.target)
    body = prog.attrs["schedule"].kernels[0].body
    kind, _, at = control.partition(" ")
    if kind == "barrier":
        body = without_barrier(body, int(at))
    elif kind == "warp.sync":
        syncs = [x for x in walk(body) if isinstance(x, Intrin) and x.name == "warp.sync"]
        body = without_intrin(body, lambda x: x is syncs[int(at)])
    else:
        part = "qa_l" if "queries" in control else "pa_l"
        body = without_intrin(body, lambda x: x.name == "wmma.mma" and x.buffers[1].name == part)
    out, want = run_half(runner, broken(prog, body), n, total, h, kvh, d, 0)
    if kind in ("barrier", "warp.sync"):
        assert not np.allclose(out, want, rtol=0, atol=1e-3), control
    else:  # measured: 9.7e-4 without q's half part, 2.7e-4 without p's; 1.9e-6 with both
        error = float(np.abs(out - want).max())
        assert np.isfinite(out).all() and 1e-4 < error < 0.01, (control, error)


@pytest.mark.parametrize("preset", ["h100", "rtx4090"])
def test_tensor_core_tiles_assemble_without_spills(preset):
    """The attention's tensor-core tiles at head_dim 64, 128 and 256 compile with nvcc for the preset's GPU: half
    m16n16k16 products (row-major queries and probabilities, col-major keys, row-major values) in their PTX, no
    register spills, at most 48 KiB of static shared memory. ptxas on 2026-11-29, sm_90: 132, 175 and 177 registers,
    47.5, 44.3 and 39.3 KiB (256 in two warps a row of 16 queries, each half the output; in one, tried: 255 registers
    and 164 bytes of spill stores)."""
    from conftest import require_nvcc

    from deploycc.kernel_runner import render
    from deploycc.runtime.devices.cuda import compile_cuda, ptxas_check

    require_nvcc()
    target = presets.load(preset).target
    for d in (64, 128, 256):
        prog = schedule_program(attention_program(512, 8, 2, d, 0.125, kv="float16"), target)
        assert prog.attrs["schedule"].rule == "attention-mma"
        ptx = compile_cuda(render(list(prog.attrs["schedule"].kernels), target), target.arch)
        assert "wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32" in ptx  # QK^T: half inputs, float accumulators
        assert "wmma.mma.sync.aligned.row.row.m16n16k16.f32.f32" in ptx  # PV
        tiles = ptxas_check(ptx, target.arch)[prog.name]
        assert tiles["spill_stores"] == 0 and tiles["shared_bytes"] <= 49152, (d, tiles)
