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
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import require_cxx, require_device

from deploycc import presets
from deploycc.ir.kernel import Schedule
from deploycc.ir.tir import Alloc, Barrier, For, IfThenElse, Seq, TensorProgram, walk
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


def without_barrier(stmt, which: int):
    """`stmt` with its `which`-th Barrier (in program order) removed."""
    seen = [0]

    def visit(s):
        if isinstance(s, Seq):
            kept = []
            for x in s.stmts:
                if isinstance(x, Barrier):
                    seen[0] += 1
                    if seen[0] - 1 == which:
                        continue
                kept.append(visit(x))
            return Seq(tuple(kept))
        if isinstance(s, (For, Alloc)):
            return dataclasses.replace(s, body=visit(s.body))
        if isinstance(s, IfThenElse):
            return dataclasses.replace(s, then_body=visit(s.then_body),
                                       else_body=None if s.else_body is None else visit(s.else_body))
        return s
    return visit(stmt)


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

