"""The cpu target's own attention schedule (keys in blocks of 16, one rescale per block) and its
vectorisable exp (dcc_expf in targets/c.py), compiled with the machine's C compiler and run.

Attention: against attention_reference (numpy, float32) at 2e-6 absolute on outputs of size ~1, for
query counts and key counts that give only a partial block, exact multiples of the block (no tail),
full blocks plus a tail, grouped-query ratios 1, 3 and 4, and scores large enough that the running
maximum moves between blocks; with a sliding window and a score cap on every backend. exp: within
2 float32 ulp (2.4e-7 relative) of float64 exp over [-87, 88], exactly 0 below -87 (softmax's masked
scores are -1e30).
"""
from __future__ import annotations

import numpy as np
import pytest
from conftest import require_cc, require_cxx, require_device

from deploycc import presets
from deploycc.ir import sym, tir
from deploycc.kernel_runner import KernelRunner, bind_shapes, render
from deploycc.op.attention import attention_reference
from deploycc.schedule import attention, schedule_program


def attention_program(n: int, h: int, kvh: int, d: int, scale: float, ring: int = 0, kv: str = "float32",
                      **attrs) -> tir.TensorProgram:
    """ring > 0: keys and values in a ring of `ring` rows, total_len a symbolic parameter; kv: the cache's type."""
    t = sym.var("total_len")
    Q = tir.Buffer("q", (sym.as_expr(n), sym.as_expr(h), sym.as_expr(d)))
    rows = sym.as_expr(ring) if ring else t
    K = tir.Buffer("k", (rows, sym.as_expr(kvh), sym.as_expr(d)), kv)
    V = tir.Buffer("v", (rows, sym.as_expr(kvh), sym.as_expr(d)), kv)
    O = tir.Buffer("o", (sym.as_expr(n), sym.as_expr(h), sym.as_expr(d)))
    extra = ((t.as_var,), {"ring": ring}) if ring else ((), {})
    return tir.TensorProgram("attention", (Q, K, V, O), None, extra[0], 1,
                             {"op": "attention", "scale": scale, **attrs, **extra[1]})


@pytest.mark.parametrize("n,total,h,kvh", [
    (1, 5, 4, 4),      # one partial block
    (1, 16, 9, 3),     # one full block, no tail
    (1, 75, 8, 2),     # four full blocks and a tail of 11
    (5, 5, 3, 1),      # prefill: every query a partial block
    (7, 40, 6, 3),     # prefill after 33 cached positions: full blocks, tails of every length
    (33, 33, 2, 2),    # prefill whose queries cross block boundaries
])
def test_blocked_attention_matches_reference(n, total, h, kvh):
    require_cc()
    device = require_device("cpu")
    target = presets.load("cpu").target
    d, scale = 64, 0.125
    prog = schedule_program(attention_program(n, h, kvh, d, scale), target)
    assert prog.attrs["schedule"].rule == "attention"
    source = render(list(prog.attrs["schedule"].kernels), target)
    assert "dcc_expf" in source and f"/ {attention.BLOCK})" in source  # the blocked form is what runs
    rng = np.random.default_rng(n * 1000 + total)
    q = (rng.standard_normal((n, h, d)) * 3).astype(np.float32)  # scores of several units: the maximum moves
    k = rng.standard_normal((total, kvh, d)).astype(np.float32)
    v = rng.standard_normal((total, kvh, d)).astype(np.float32)
    out = np.zeros((n, h, d), np.float32)
    KernelRunner(device, target)(prog, [q, k, v, out], [total])
    want = attention_reference(q, k, v, scale)
    np.testing.assert_allclose(out, want, rtol=0, atol=2e-6)


# the cpu and cpu-opencl presets take the one-thread-per-row form; adreno (on PoCL), cpu-webgpu and h100 the
# split form (a block of threads per row splits the keys and combines in shared memory); cuda-emu: h100's CUDA
# under the CPU emulation of CUDA's thread model (runtime/devices/cuda_emu.py), threads in reverse order
PRESETS = {"cpu": "cpu", "opencl": "cpu-opencl", "adreno": "adreno", "webgpu": "cpu-webgpu", "cuda": "h100",
           "cuda-emu": "h100"}


def device_for(backend: str, target):
    if backend == "cuda-emu":
        require_cxx()
        from deploycc.runtime.devices import open_device

        return open_device("cuda", emulate="reverse")
    return require_device(target.kind)


@pytest.mark.parametrize("backend", sorted(PRESETS))
@pytest.mark.parametrize("n,total,h,kvh,window,cap,ring", [
    (1, 40, 4, 2, 5, 0.0, 0),      # decode: a window inside the last block
    (1, 75, 8, 2, 16, 0.0, 0),     # decode: a window of exactly one block, starting mid-block
    (7, 40, 6, 3, 20, 2.0, 0),     # prefill after 33 cached: a window of a block and a tail, scores capped at 2
    (33, 33, 2, 2, 6, 50.0, 0),    # prefill: the first queries see fewer keys than the window
    (3, 3, 4, 4, 8, 1.0, 0),       # a window longer than the cache: causal alone
    (1, 75, 4, 2, 16, 0.0, 16),    # decode over a ring of exactly the window: it wrapped four times
    (7, 40, 6, 3, 20, 2.0, 26),    # prefill of 7 over a ring of window + 6 rows, wrapped mid-window
    (5, 5, 2, 1, 6, 0.0, 10),      # a ring not yet full
])
def test_windowed_and_capped_attention(backend, n, total, h, kvh, window, cap, ring):
    """The sliding window (keys j with i + total - n - window < j <= i + total - n) and the score cap
    (cap * tanh(s / cap)) in both schedule forms: the cpu's blocked loop starts at the window's first key; the
    OpenCL and WGSL loop likewise; with a ring cache (window + seq_len - 1 rows or more) key j is read from row
    j % rows. Against attention_reference at 2e-6 (OpenCL/WGSL: 1e-5, their native exp)."""
    if backend == "cpu":
        require_cc()
    target = presets.load(PRESETS[backend]).target
    device = device_for(backend, target)
    d, scale = 32, 0.125
    attrs = {"window": window, **({"softcap": cap} if cap else {})}
    prog = schedule_program(attention_program(n, h, kvh, d, scale, ring, **attrs), target)
    # the GPU presets: decode split over threads and blocks, prefill in tiles of 16 queries (attention_tiles.py)
    form = ("attention-split" if n == 1 else "attention-tiles") if backend in SPLIT else "attention"
    assert prog.attrs["schedule"].rule == form
    split = "sm_kv" in render(list(prog.attrs["schedule"].kernels), target)  # the keys and values a kv head's queries share
    assert split == (form == "attention-split"), "the form the presets take"
    rng = np.random.default_rng(n * 1000 + total)
    q = (rng.standard_normal((n, h, d)) * 3).astype(np.float32)
    k = rng.standard_normal((total, kvh, d)).astype(np.float32)
    v = rng.standard_normal((total, kvh, d)).astype(np.float32)
    out = np.zeros((n, h, d), np.float32)
    if ring:  # the last `ring` positions, each at its row; what the ring lost is garbage, never read
        kr, vr = (rng.standard_normal((ring, kvh, d)).astype(np.float32) * 1e3 for _ in range(2))
        for j in range(max(0, total - ring), total):
            kr[j % ring], vr[j % ring] = k[j], v[j]
        KernelRunner(device, target)(prog, [q, kr, vr, out], [total])
        np.testing.assert_allclose(attention_reference(q, kr, vr, scale, window=window, softcap=cap, total=total),
                                   attention_reference(q, k, v, scale, window=window, softcap=cap), rtol=0, atol=1e-6)
    else:
        KernelRunner(device, target)(prog, [q, k, v, out], [total])
    want = attention_reference(q, k, v, scale, window=window, softcap=cap)
    assert np.abs(want - attention_reference(q, k, v, scale)).max() > 1e-2 or window >= total  # the window matters
    np.testing.assert_allclose(out, want, rtol=0, atol=2e-6 if backend == "cpu" else 1e-5)


SPLIT = ("adreno", "webgpu", "cuda", "cuda-emu")


@pytest.mark.parametrize("backend", ["adreno", "webgpu", "cuda-emu"])
@pytest.mark.parametrize("total,window,ring", [(1, 0, 0), (127, 0, 0), (128, 0, 0), (129, 0, 0), (255, 0, 0),
                                               (1300, 0, 0), (1300, 100, 0), (700, 90, 128)])
def test_decode_attention_split_over_blocks(backend, total, window, ring):
    """Flash-decoding (the split form with one query a head): S = ceil(keys / 2T) blocks a kv head, each holding the
    kv head's query heads (grouped-query attention: each key and value loaded once into shared memory for them, T
    threads a query head), write partial maxima, sums and accumulators to a workspace and a second kernel combines
    them (on CUDA the last block of a kv head to arrive: one launch); key counts on both sides of a block's share (128
    keys on h100 at head_dim 32, 64 on adreno's and cpu-webgpu's 32 KiB), with a sliding window (blocks past the
    window's keys hold nothing) and a ring cache. Against attention_reference at 1e-5."""
    target = presets.load(PRESETS[backend]).target
    device = device_for(backend, target)
    h, kvh, d, scale = 4, 2, 32, 0.125
    attrs = {"window": window} if window else {}
    prog = schedule_program(attention_program(1, h, kvh, d, scale, ring, **attrs), target)
    sched = prog.attrs["schedule"]
    arrive = backend == "cuda-emu"  # one kernel: the last block to arrive combines (targets/backend.py grid_arrivals)
    assert sched.rule == "attention-split" and len(sched.kernels) == (1 if arrive else 2)
    assert [w.name for w in sched.workspace] == ["part", "arrived"][:1 + arrive]
    assert [w.name for w in sched.zeroed] == ["arrived"][:arrive]
    T = attention.split_threads(target, d, h // kvh)
    keys = attention.SPLIT_KEYS_PER_THREAD * T
    part = sched.kernels[0]
    assert part.threads == T * (h // kvh), "a block: the query heads of one kv head"
    rng = np.random.default_rng(total + window)
    q = (rng.standard_normal((1, h, d)) * 3).astype(np.float32)
    k = rng.standard_normal((total, kvh, d)).astype(np.float32)
    v = rng.standard_normal((total, kvh, d)).astype(np.float32)
    out = np.zeros((1, h, d), np.float32)
    if ring:
        kr, vr = (rng.standard_normal((ring, kvh, d)).astype(np.float32) * 1e3 for _ in range(2))
        for j in range(max(0, total - ring), total):
            kr[j % ring], vr[j % ring] = k[j], v[j]
        runner = KernelRunner(device, target)
        runner(prog, [q, kr, vr, out], [total])
    else:
        runner = KernelRunner(device, target)
        runner(prog, [q, k, v, out], [total])
    assert runner.launches == 1 + (not arrive)
    np.testing.assert_allclose(out, attention_reference(q, k, v, scale, window=window), rtol=0, atol=1e-5)
    env = bind_shapes(prog, [q, kr if ring else k, vr if ring else v, out], [total])
    assert int(sym.evaluate(part.groups, env)) == kvh * -(-total // keys)  # S blocks a kv head, not a query head
    assert keys == {"cuda-emu": 128, "adreno": 64, "webgpu": 64}[backend]


def unary_on_cpu(op: str, call: str, x: np.ndarray) -> np.ndarray:
    """y = op(x) by the cpu target's kernel, whose C source must call `call`."""
    require_cc()
    device = require_device("cpu")
    target = presets.load("cpu").target
    X = tir.Buffer("x", (sym.as_expr(x.size),))
    Y = tir.Buffer("y", (sym.as_expr(x.size),))
    its = tir.iters("i", (x.size,))
    i = tir.v(its[0])
    prog = tir.TensorProgram(op, (X, Y), tir.Block(op, its, tir.Store(Y, (i,), tir.unary(op, X[i]))))
    prog = schedule_program(prog, target)
    assert call in render(list(prog.attrs["schedule"].kernels), target)
    y = np.zeros(x.size, np.float32)
    KernelRunner(device, target)(prog, [x, y], [])
    return y


def test_cpu_exp_is_accurate_and_vectorisable():
    count = 1 << 16
    x = np.concatenate([np.linspace(-87.0, 88.0, count - 4, dtype=np.float32),
                        np.float32([-87.5, -1e30, -200.0, 0.0])])
    y = unary_on_cpu("exp", "dcc_expf(", x)
    want = np.exp(x[:-4].astype(np.float64))
    rel = np.abs(y[:-4] - want) / want
    assert rel.max() <= 2.4e-7, f"worst relative error {rel.max():.3g} at x = {x[rel.argmax()]}"
    assert list(y[-4:]) == [0.0, 0.0, 0.0, 1.0]


def test_cpu_tanh_is_accurate_and_vectorisable():
    """dcc_tanhf (GeGLU, soft-capping) within 2e-7 absolute and 4 float32 ulp relative of float64 tanh over
    [-20, 20], odd, and exactly +-1 far out."""
    count = 1 << 16
    x = np.concatenate([np.linspace(-20.0, 20.0, count - 6, dtype=np.float32),
                        np.float32([0.0, 1e-30, -1e-8, 0.39999998, 0.4, 1e30])])
    y = unary_on_cpu("tanh", "dcc_tanhf(", x)
    want = np.tanh(x.astype(np.float64))
    err = np.abs(y - want)
    assert err.max() <= 2e-7, f"worst absolute error {err.max():.3g} at x = {x[err.argmax()]}"
    rel = err / np.maximum(np.abs(want), 1e-30)
    assert rel.max() <= 4 * 1.2e-7, f"worst relative error {rel.max():.3g} at x = {x[rel.argmax()]}"
    assert y[-1] == 1.0 and y[-6] == 0.0
