"""Batched steps over a page pool: the paged form of attention (nn.Cache, op/attention.py) and the
kv_copy_paged kernel, legalized as the pipeline does, scheduled for each backend and run there.

Against paged_attention_reference (numpy float32: each query alone over its own sequence's keys, gathered
through the page table) at 2e-6 absolute on the cpu and 1e-5 on OpenCL/WGSL (their native exp); the pool
rows that no sequence's table names hold 1e3-sized garbage, so reading a wrong row fails loudly.
"""
from __future__ import annotations

import numpy as np
import pytest
from conftest import require_cc, require_cxx, require_device

from deploycc import presets
from deploycc.ir import annotation as A
from deploycc.ir import sym
from deploycc.ir.expr import Call, Var
from deploycc.ir.module import IRModule
from deploycc.ir.op import get as get_op
from deploycc.kernel_runner import KernelRunner, render
from deploycc.op.attention import RefPagedCache, paged_attention_reference
from deploycc.schedule import attention, schedule_program
from deploycc.vm.lower import kv_copy_paged_program, kv_pair_program

# the cpu and cpu-opencl presets take the one-thread-per-row form; adreno (on PoCL), cpu-webgpu and h100 the
# split form (a block of threads per row splits the keys and combines in shared memory), its keys also split over
# blocks (flash-decoding: a partial per block, then a combine) up to SPLIT_ROWS queries; cuda-emu: h100's CUDA
# under the CPU emulation of CUDA's thread model, threads in reverse order
PRESETS = {"cpu": "cpu", "opencl": "cpu-opencl", "adreno": "adreno", "webgpu": "cpu-webgpu", "cuda": "h100",
           "cuda-emu": "h100"}
GPU = ("adreno", "webgpu", "cuda", "cuda-emu")


def device_for(backend: str, target):
    if backend == "cuda-emu":
        require_cxx()
        from deploycc.runtime.devices import open_device

        return open_device("cuda", emulate="reverse")
    if backend == "cpu":
        require_cc()
    return require_device(target.kind)


def paged_program(n: int, h: int, kvh: int, d: int, rows: int, kv: str = "float32", **attrs):
    """The attention program legalization makes of a batched step's call (symbolic seq_len, batch, pages_len); kv:
    the pool's type."""
    seq, batch, width = sym.var("seq_len"), sym.var("batch"), sym.var("pages_len")
    args = (Var("q", A.Tensor((seq, h, d), "float32")), Var("k", A.Tensor((rows, kvh, d), kv)),
            Var("v", A.Tensor((rows, kvh, d), kv)), Var("pages", A.Tensor((batch, width), "int32")),
            Var("seq", A.Tensor((seq,), "int32")), Var("pos", A.Tensor((seq,), "int32")))
    op = get_op("attention")
    call = Call("attention", args, attrs, op.infer(args, attrs))
    mod = IRModule()
    tir_call = op.legalize(call, mod)
    return mod[tir_call.program]


def scatter(rng, starts, counts, page_size, pages, kvh, d):
    """Page tables of distinct shuffled pages for sequences of starts[b] + counts[b] tokens, and pools whose
    unused rows are garbage."""
    need = [-(-(s + c) // page_size) for s, c in zip(starts, counts)]
    order = rng.permutation(pages)
    tables, at = [], 0
    for k in need:
        tables.append([int(x) for x in order[at:at + k]])
        at += k
    assert at <= pages
    cache = RefPagedCache(1, pages, page_size, kvh, d)
    cache.k[0][:] = rng.standard_normal(cache.k[0].shape).astype(np.float32) * 1e3
    cache.v[0][:] = rng.standard_normal(cache.v[0].shape).astype(np.float32) * 1e3
    cache.plan(tables, starts, counts)
    return cache


def step_case(starts, counts, size, pages, kvh, d):
    """(the generator, the step's metadata, its rows, the key and value pools): every sequence's keys and values at
    the rows its table names, garbage elsewhere (scatter)."""
    rng = np.random.default_rng(sum(starts) * 31 + sum(counts))
    cache = scatter(rng, starts, counts, size, pages, kvh, d)
    m = cache.meta
    k, v = cache.k[0], cache.v[0]
    for b, (s, c) in enumerate(zip(starts, counts)):
        rows = np.asarray([m["pages"][b][x // size] * size + x % size for x in range(s + c)])
        k[rows] = rng.standard_normal((len(rows), kvh, d)).astype(np.float32)
        v[rows] = rng.standard_normal((len(rows), kvh, d)).astype(np.float32)
    return rng, m, len(m["pos"]), k, v


@pytest.mark.parametrize("backend", sorted(PRESETS))
@pytest.mark.parametrize("starts,counts,h,kvh,window,cap", [
    ([0], [1], 4, 4, 0, 0.0),                  # one sequence's first token
    ([37, 0, 15], [1, 1, 1], 6, 3, 0, 0.0),    # decode of three sequences of different lengths
    ([0, 20, 3], [7, 1, 13], 4, 1, 0, 2.0),    # ragged: two prefills beside a decode, scores capped
    ([30, 0], [5, 9], 8, 2, 6, 0.0),           # a sliding window shorter than both
    ([47], [17], 2, 2, 20, 50.0),              # one prefill crossing pages, window and cap
    ([3, 40, 0, 17], [4, 4, 4, 4], 4, 2, 0, 0.0),  # SPLIT_ROWS (16) queries: the last count split over blocks
    ([300, 5, 120], [1, 2, 1], 6, 2, 0, 0.0),  # a table of 19 pages: keys over several blocks, most past 6 and 121
    ([290], [3], 4, 4, 100, 30.0),             # a window across two blocks' keys, capped
])
def test_paged_attention_matches_reference(backend, starts, counts, h, kvh, window, cap):
    target = presets.load(PRESETS[backend]).target
    device = device_for(backend, target)
    d, scale, size, pages = 32, 0.125, 16, 48
    attrs = {"scale": scale, "page_size": size, **({"window": window} if window else {}),
             **({"softcap": cap} if cap else {})}
    rng, m, n, k, v = step_case(starts, counts, size, pages, kvh, d)
    q = (rng.standard_normal((n, h, d)) * 3).astype(np.float32)
    prog = schedule_program(paged_program(n, h, kvh, d, pages * size, **attrs), target)
    sched = prog.attrs["schedule"]
    gpu = backend in GPU
    split = "sm_kv" in render(list(sched.kernels), target)  # the keys and values shared by a kv head's queries
    assert split == gpu, "the form the presets take"
    assert sched.rule == ("attention-split|attention" if gpu else "attention")
    arrive = gpu and target.grid_arrivals  # CUDA: the split's last block to arrive combines (schedule/attention.py)
    pair = ["attention_part"] + ([] if arrive else ["attention_merge"])
    assert [k.name for k in sched.kernels] == (pair + ["attention"] if gpu else ["attention"])
    out = np.zeros((n, h, d), np.float32)
    runner = KernelRunner(device, target)
    runner(prog, [q, k, v, m["pages"], m["seq"], m["pos"], out], [])
    if gpu:  # the split pair up to SPLIT_ROWS queries, the one-block-a-row kernel above: their guards choose
        assert runner.launches == (len(pair) if n <= attention.SPLIT_ROWS else 1), n
    want = paged_attention_reference(q, k, v, m["pages"], m["seq"], m["pos"], scale, size, window, cap)
    assert np.abs(want).max() < 10  # no garbage row was read by the reference
    np.testing.assert_allclose(out, want, rtol=0, atol=2e-6 if backend == "cpu" else 1e-5)


@pytest.mark.parametrize("backend", sorted(PRESETS))
def test_kv_copy_paged_writes_the_slots(backend):
    target = presets.load(PRESETS[backend]).target
    device = device_for(backend, target)
    rng = np.random.default_rng(7)
    cache = scatter(rng, [5, 0, 30], [3, 1, 9], 16, 12, 2, 8)
    slot = cache.meta["slot"]
    src = rng.standard_normal((len(slot), 2, 8)).astype(np.float32)
    pool = cache.k[0].copy()
    prog = schedule_program(kv_copy_paged_program(), target)
    KernelRunner(device, target)(prog, [src, slot, pool], [])
    want = cache.k[0].copy()
    want[slot] = src
    np.testing.assert_array_equal(pool, want)


@pytest.mark.parametrize("backend", sorted(GPU))
@pytest.mark.parametrize("kind", ["plain", "ring", "paged"])
def test_keys_and_values_in_one_launch(backend, kind):
    """The GPU presets' kv.append (vm/lower.py: kv_pair_program): keys and values into their caches by one kernel
    (schedule/fallback.py: blocks side by side), at an offset, around a ring, or into a page pool's slots."""
    target = presets.load(PRESETS[backend]).target
    device = device_for(backend, target)
    prog = schedule_program(kv_pair_program(paged=kind == "paged", ring=kind == "ring"), target)
    assert [k.name for k in prog.attrs["schedule"].kernels] == [prog.name]  # one launch
    rng = np.random.default_rng(3)
    n, h, d, rows, offset = 5, 2, 8, 12, 9
    k, v = (rng.standard_normal((n, h, d)).astype(np.float32) for _ in range(2))
    caches = [rng.standard_normal((rows, h, d)).astype(np.float32) for _ in range(2)]
    want = [c.copy() for c in caches]
    if kind == "paged":
        slot = rng.permutation(rows)[:n].astype(np.int32)
        at, args, syms = slot, [k, v, slot, *caches], []
    else:
        at = (offset + np.arange(n)) % rows if kind == "ring" else offset - 5 + np.arange(n)
        args, syms = [k, v, *caches], [int(offset if kind == "ring" else offset - 5)]
    want[0][at], want[1][at] = k, v
    runner = KernelRunner(device, target)
    runner(prog, args, syms)
    assert runner.launches == 1
    np.testing.assert_array_equal(caches[0], want[0])
    np.testing.assert_array_equal(caches[1], want[1])


@pytest.mark.parametrize("backend", ["cuda-emu", "cuda"])
@pytest.mark.parametrize("starts,counts,h,kvh,d,window,cap,shuffled", [
    ([0, 20, 3], [7, 1, 13], 4, 1, 64, 0, 2.0, False),        # 21 rows: a block of three sequences, scores capped
    ([0, 10, 100], [40, 30, 25], 4, 2, 64, 0, 0.0, False),    # 95 rows: blocks across sequences, 2-8 pages a table
    ([47], [17], 2, 2, 128, 20, 50.0, False),                 # one prefill crossing pages, window and cap, 128
    ([5, 60], [50, 19], 2, 1, 256, 30, 0.0, False),           # head_dim 256 (two warps a row of queries), a window
    ([0, 10, 100], [40, 30, 25], 4, 2, 32, 0, 0.0, True),     # the rows in any order (verify --kernels draws such)
])
def test_prompt_chunks_over_a_half_pool_take_the_tensor_cores(backend, starts, counts, h, kvh, d, window, cap,
                                                               shuffled):
    """Above SPLIT_ROWS rows (a prompt's chunk in the server's step), over a float16 pool on h100, the rows' kernel
    is the tensor cores' tiles (schedule/attention_mma.py, `paged`): a block's rows of 16 queries belong to one or
    more of the step's sequences, each sequence's keys taken in tiles through its page table, the other sequences'
    scored NEG. Against the reference on the same half keys and values at 1e-5, garbage (1e3-sized) in every row no
    table names, shuffled thread order under the emulation (and on a GPU where there is one)."""
    target = presets.load("h100").target
    if backend == "cuda-emu":
        require_cxx()
        from deploycc.runtime.devices import open_device

        device = open_device("cuda", emulate="shuffle")
    else:
        device = require_device("cuda")
    scale, size, pages = 0.125, 16, 48
    attrs = {"scale": scale, "page_size": size, **({"window": window} if window else {}),
             **({"softcap": cap} if cap else {})}
    rng, m, n, k, v = step_case(starts, counts, size, pages, kvh, d)
    k, v = k.astype(np.float16), v.astype(np.float16)
    q = (rng.standard_normal((n, h, d)) * 3).astype(np.float32)
    if shuffled:  # a block's rows then hold every sequence, out of order
        order = rng.permutation(n)
        m = {**m, "seq": np.ascontiguousarray(m["seq"][order]), "pos": np.ascontiguousarray(m["pos"][order])}
    prog = schedule_program(paged_program(n, h, kvh, d, pages * size, "float16", **attrs), target)
    sched = prog.attrs["schedule"]
    assert sched.rule == "attention-split|attention-mma" and sched.kernels[-1].tensor == "attention"
    out = np.zeros((n, h, d), np.float32)
    runner = KernelRunner(device, target)
    runner(prog, [q, k, v, m["pages"], m["seq"], m["pos"], out], [])
    assert runner.launches == 1  # the rows' kernel alone: the guards choose it above SPLIT_ROWS
    want = paged_attention_reference(q, k.astype(np.float32), v.astype(np.float32), m["pages"], m["seq"], m["pos"],
                                     scale, size, window, cap)
    assert np.abs(want).max() < 10  # no garbage row was read by the reference
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-5)
