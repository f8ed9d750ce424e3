"""CUDA C executed on the CPU (runtime/devices/cuda_emu.py): the emulation's own semantics held to what CUDA documents,
each with a kernel written to break it, then whole CUDA packages through the runtime's CUDA launch path.

Semantics: a shared-memory tree reduction gives numpy's sums in every thread order; the same kernel without its
barriers gives wrong sums in forward order (shared memory is poisoned with NaN before each block), and is reported
when a barrier is skipped by some threads (returned early) or reached at different lines (divergent); a store past
either end of a buffer is reported; 2-D grids and blocks see their coordinates; `half` converts as cuda_fp16.h does
(round to nearest even, subnormals, overflow to inf, NaN), bit for bit against numpy's float16 over every float32
bit pattern class; the launch path refuses a block of more than 1024 threads.

Packages: a tiny Qwen3 (qwen3-x32) compiled for h100 (q4f16_1) and rtx4090 (q0f16) runs every kernel against its
loop-level program (`verify --kernels`, from the package alone: its own runtime) and its logits against the numpy
reference (`verify`, deploycc's CLI, which has the reference), with DEPLOYCC_CUDA_EMULATE in forward, reverse and
shuffled orders (the h100 package's prefill linears on the tensor cores); the negative controls (the RMSNorm kernel's
barrier deleted, its store shifted by one row, its warp butterfly a step short) fail in one line naming the kernel.
Tensor cores: wmma's tf32 m16n16k8 fragments, loads and stores in both layouts, mma and the tf32 rounding against a
numpy model, a call some lanes skip reported, the same kernel compiled by nvcc; m16n16k16 with bfloat16 and half
inputs likewise, `__nv_bfloat16`'s conversions bit for bit against a model of cuda_bf16.h's, and a fragment's
misaligned pointer or leading dimension reported.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from bad_inputs.common import reseal
from conftest import require_cxx

from deploycc.runtime.devices import DeviceError, open_device
from fixtures import make_tiny

HEADER = "#include <cuda_fp16.h>\n#include <math_constants.h>\n"
ROWSUM = HEADER + r'''
extern "C" __global__ void rowsum(const float* __restrict__ x, float* __restrict__ y, int n) {
  __shared__ float red[128];
  int t = (int)threadIdx.x;
  float acc = 0.0f;
  for (int j = t; j < n; j += 128) acc += x[(long long)blockIdx.x * n + j];
  red[t] = acc;
  __syncthreads();
  for (int w = 64; w > 0; w >>= 1) {
    if (t < w) red[t] += red[t + w];
    __syncthreads();
  }
  if (t == 0) y[blockIdx.x] = red[0];
}
'''


@pytest.fixture(autouse=True)
def cxx():
    require_cxx()


def emulator(order: str = "forward"):
    return open_device("cuda", emulate=order)


def rowsum(order: str, source: str = ROWSUM):
    x = np.random.default_rng(0).standard_normal((37, 1000)).astype(np.float32)
    d = emulator(order)
    k = d.build(source, ["rowsum"])["rowsum"]
    y = d.alloc(37 * 4)
    d.launch(k, [d.upload(x), y, 1000], (37, 1, 1), (128, 1, 1))
    return d.download(y, 37, np.float32), x.sum(axis=1)


@pytest.mark.parametrize("order", ["forward", "reverse", "shuffle"])
def test_a_barrier_reduction_is_right_in_every_order(order):
    got, want = rowsum(order)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


def test_missing_barriers_are_caught():
    no_tree_barrier = ROWSUM.replace("    if (t < w) red[t] += red[t + w];\n    __syncthreads();",
                                     "    if (t < w) red[t] += red[t + w];")
    got, want = rowsum("forward", no_tree_barrier)  # thread 0 reads red[64] before thread 64 wrote it: NaN
    assert not np.allclose(got, want, rtol=1e-3, atol=1e-2)
    no_first = ROWSUM.replace("  red[t] = acc;\n  __syncthreads();", "  red[t] = acc;")
    got, want = rowsum("forward", no_first)
    assert np.isnan(got).all()  # the poison reached every sum
    early = ROWSUM.replace("    if (t < w) red[t] += red[t + w];\n    __syncthreads();",
                           "    if (t >= w) return;\n    red[t] += red[t + w];\n    __syncthreads();")
    with pytest.raises(DeviceError, match=r"threads returned while thread \(\d+, 0, 0\) waits at the barrier of line"):
        rowsum("forward", early)
    divergent = ROWSUM.replace("    if (t < w) red[t] += red[t + w];\n    __syncthreads();",
                               "    if (t < w) { red[t] += red[t + w]; __syncthreads(); }\n    else { __syncthreads(); }")
    with pytest.raises(DeviceError, match=r"divergent barrier: thread \(\d+, 0, 0\) waits at line \d+, thread"):
        rowsum("reverse", divergent)


STORE = HEADER + r'''
extern "C" __global__ void store(float* __restrict__ y, int n, int shift) {
  int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) y[i + shift] = 1.0f;
}
'''


def test_stores_out_of_bounds_are_reported():
    d = emulator()
    k = d.build(STORE, ["store"])["store"]
    y = d.alloc(100 * 4)
    d.launch(k, [y, 100, 0], (4, 1, 1), (32, 1, 1))
    assert (d.download(y, 100, np.float32) == 1).all()
    for shift, where in ((1, "past the end"), (-1, "before the start")):
        with pytest.raises(DeviceError, match=f"store .* wrote {where} of its buffer argument 0 \\(400 bytes\\)"):
            d.launch(k, [d.alloc(400), 100, shift], (4, 1, 1), (32, 1, 1))


GEOMETRY = HEADER + r'''
extern "C" __global__ void where(int* __restrict__ out) {
  long long b = blockIdx.y * gridDim.x + blockIdx.x;
  long long t = (threadIdx.y * blockDim.x + threadIdx.x);
  long long i = b * blockDim.x * blockDim.y + t;
  out[4 * i] = (int)blockIdx.x; out[4 * i + 1] = (int)blockIdx.y; out[4 * i + 2] = (int)threadIdx.x;
  out[4 * i + 3] = (int)threadIdx.y;
}
'''


def test_launch_geometry():
    d = emulator("shuffle")
    k = d.build(GEOMETRY, ["where"])["where"]
    out = d.alloc(3 * 2 * 8 * 4 * 16)
    d.launch(k, [out], (3, 2, 1), (8, 4, 1))
    got = d.download(out, (2, 3, 4, 8, 4), np.int32)
    by, bx, ty, tx = np.meshgrid(range(2), range(3), range(4), range(8), indexing="ij")
    np.testing.assert_array_equal(got, np.stack([bx, by, tx, ty], axis=-1))
    with pytest.raises(DeviceError, match="exceeds 1024 threads"):
        d.launch(k, [out], (1, 1, 1), (1025, 1, 1))


HALF = HEADER + r'''
extern "C" __global__ void halves(const float* __restrict__ x, half* __restrict__ h, float* __restrict__ back, int n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) { h[i] = __float2half(x[i]); back[i] = __half2float(h[i]); }
}
'''


def test_half_conversions_are_cuda_fp16s():
    """Round to nearest even, against numpy's float16 (IEEE): ties both ways, every subnormal, the overflow edge
    (65519.996 -> 65504, 65520 -> inf), signed zeros, inf and NaN, and a million random bit patterns."""
    rng = np.random.default_rng(0)
    every_half = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    finite = every_half[np.isfinite(every_half)]
    finite = np.unique(finite)
    mids = (finite[:-1].astype(np.float64) + finite[1:]) / 2  # the ties between neighbouring halves
    special = np.array([0.0, -0.0, 65504, 65519.996, 65520, -65520, 1e-8, 2.0 ** -25, 2.0 ** -24 * 1.5, np.inf,
                        -np.inf, np.nan], np.float32)
    x = np.concatenate([every_half, mids.astype(np.float32), special,
                        rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32).view(np.float32)])
    d = emulator()
    k = d.build(HALF, ["halves"])["halves"]
    h, back = d.alloc(x.size * 2), d.alloc(x.size * 4)
    d.launch(k, [d.upload(x), h, back, x.size], (-(-x.size // 256), 1, 1), (256, 1, 1))
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    got = d.download(h, x.size, np.float16)
    nan = np.isnan(want)
    assert (np.isnan(got) == nan).all()
    np.testing.assert_array_equal(got[~nan].view(np.uint16), want[~nan].view(np.uint16))
    np.testing.assert_array_equal(d.download(back, x.size, np.float32)[~nan], want[~nan].astype(np.float32))


# ---- whole packages, from the package alone ---------------------------------------------------------------------

PACKAGES = {"h100": "q4f16_1", "rtx4090": "q0f16"}


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    from deploycc.package import compile_model

    made = {}

    def get(preset: str):
        if preset not in made:
            out = tmp_path_factory.mktemp("cuda-emu") / preset
            made[preset] = compile_model(str(make_tiny("qwen3-x32")), preset, quantization=PACKAGES[preset],
                                         context_window=64, out=str(out))
        return made[preset]
    return get


def run_emulated(pkg, order: str, *args, compiler: bool = False):
    """The package's own entry point (or, with `compiler`, deploycc's CLI on it) with the emulation as its GPU."""
    env = {**os.environ, "DEPLOYCC_CUDA_EMULATE": order}
    cmd = [sys.executable, "-m", "deploycc", args[0], str(pkg), *args[1:]] if compiler else [sys.executable, str(pkg),
                                                                                               *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.parametrize("preset,order", [("h100", "forward"), ("h100", "reverse"), ("rtx4090", "shuffle")])
def test_packages_verify_under_the_emulation(package, preset, order):
    pkg = package(preset)
    r = run_emulated(pkg, order, "verify", "--kernels", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(r.stdout)
    assert report["passed"] and f"({order} thread order)" in report["device"]
    entries = json.loads((pkg / "manifest.json").read_text())["kernels"]["entries"]
    assert {k for row in report["kernels"] for k in row["kernels"]} == set(entries)
    r = run_emulated(pkg, order, "verify", "--steps", "4", compiler=True)  # logits: deploycc's numpy reference
    assert r.returncode == 0 and r.stdout.strip().splitlines()[-1].startswith("ok: against the numpy reference"), \
        r.stdout[-2000:] + r.stderr[-2000:]


def rms_norm_body(source: str) -> tuple[int, int]:
    start = source.index(' rms_norm(')
    return start, source.index("\n}\n", start)


@pytest.mark.parametrize("mutation", ["no barrier", "store shifted by a row", "a shuffle step short"])
def test_a_broken_cuda_kernel_fails_verification(package, tmp_path, mutation):
    """The RMSNorm of rows of 64 (two warps): its warp sums are shuffle butterflies, and one barrier passes the two
    warps' sums through shared memory. Without the barrier, the forward order has thread 0 read the second warp's
    sum before thread 32 wrote it (the poisoned NaN); with the butterfly's first step (distance 16) left out, each
    lane holds the sum of 16 lanes, not the warp's."""
    pkg = tmp_path / "pkg"
    shutil.copytree(package("h100"), pkg)
    src = pkg / "kernels" / "kernels.cu"
    text = src.read_text()
    start, end = rms_norm_body(text)
    body = text[start:end]
    if mutation == "no barrier":
        assert body.count("  __syncthreads();\n") == 1
        body = body.replace("  __syncthreads();\n", "", 1)
    elif mutation == "a shuffle step short":
        assert body.count("int sg_o = 16;") == 1
        body = body.replace("int sg_o = 16;", "int sg_o = 8;")
    else:
        assert body.count("      y[64 * seq_len") == 1
        body = body.replace("      y[64 * seq_len", "      y[64 + 64 * seq_len")
    src.write_text(text[:start] + body + text[end:])
    reseal(pkg)
    r = run_emulated(pkg, "forward", "verify", "--kernels")
    assert r.returncode == 1, (r.stdout[-2000:], r.stderr[-2000:])
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and "rms_norm" in errors[0], r.stderr[-2000:]


# ---- warp primitives: CUDA's documented semantics, each against a numpy model --------------------------------

SHUFFLES = HEADER + r'''
extern "C" __global__ void shuffles(const float* __restrict__ x, float* __restrict__ y, int width) {
  int t = (int)(blockIdx.x * blockDim.x + threadIdx.x);
  float v = x[t];
  y[6 * t] = __shfl_xor_sync(0xffffffffu, v, 5, width);
  y[6 * t + 1] = __shfl_down_sync(0xffffffffu, v, 3, width);
  y[6 * t + 2] = __shfl_up_sync(0xffffffffu, v, 2, width);
  y[6 * t + 3] = __shfl_sync(0xffffffffu, v, 7, width);
  float s = v;  // a butterfly sum: every lane ends with its segment's total
  for (int off = width / 2; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off, width);
  y[6 * t + 4] = s;
  __syncwarp();
  y[6 * t + 5] = (float)__shfl_sync(0xffffffffu, t * 1000, 31);  // an int, from lane 31 of the warp
}
'''


def shuffle_model(x: np.ndarray, width: int) -> np.ndarray:
    """CUDA C Programming Guide, warp shuffle functions: lanes in segments of `width`; xor reads lane ^ mask, down
    lane + delta and up lane - delta unless that leaves the segment (then the lane's own value), idx lane src of
    the segment."""
    out = np.zeros((x.size, 6), np.float32)
    for t in range(x.size):
        warp0, lane = t - t % 32, t % 32
        seg = lane - lane % width
        at = lambda src: x[warp0 + src]  # noqa: E731
        out[t, 0] = at(lane ^ 5) if (lane ^ 5) - (lane ^ 5) % width == seg else x[t]
        out[t, 1] = at(lane + 3) if lane % width + 3 < width else x[t]
        out[t, 2] = at(lane - 2) if lane % width - 2 >= 0 else x[t]
        out[t, 3] = at(seg + 7 % width)
        out[t, 4] = x[warp0 + seg:warp0 + seg + width].sum(dtype=np.float32)
        out[t, 5] = (warp0 + 31) * 1000
    return out


@pytest.mark.parametrize("order", ["forward", "reverse", "shuffle"])
@pytest.mark.parametrize("width", [32, 16, 8])
def test_warp_shuffles_follow_cudas_semantics(order, width):
    x = np.random.default_rng(width).integers(-50, 50, 4 * 64).astype(np.float32)  # sums exact in any order
    d = emulator(order)
    k = d.build(SHUFFLES, ["shuffles"])["shuffles"]
    y = d.alloc(x.size * 6 * 4)
    d.launch(k, [d.upload(x), y, width], (4, 1, 1), (64, 1, 1))
    np.testing.assert_array_equal(d.download(y, (x.size, 6), np.float32), shuffle_model(x, width))


def test_warp_primitives_not_every_lane_reaches_are_reported():
    half = HEADER + r'''
extern "C" __global__ void half(float* __restrict__ y) {
  int t = (int)threadIdx.x;
  float v = (float)t;
  if (t % 32 < 16) v = __shfl_xor_sync(0xffffffffu, v, 1);
  y[t] = v;
}
'''
    d = emulator()
    k = d.build(half, ["half"])["half"]
    with pytest.raises(DeviceError, match=r"warp 0: lane 0 waits at the warp primitive of line \d+ while lane 16 "
                                          r"returned: every lane of the warp must reach it"):
        d.launch(k, [d.alloc(64 * 4)], (1, 1, 1), (64, 1, 1))
    partial = half.replace("if (t % 32 < 16) v = __shfl_xor_sync(0xffffffffu", "v = __shfl_xor_sync(0x0000ffffu")
    k = d.build(partial, ["half"])["half"]
    with pytest.raises(DeviceError, match="with a mask other than 0xffffffff: only full warps are emulated"):
        d.launch(k, [d.alloc(64 * 4)], (1, 1, 1), (64, 1, 1))


DP4A = HEADER + r'''
extern "C" __global__ void dots(const int* __restrict__ a, const int* __restrict__ b, int* __restrict__ s,
                                unsigned int* __restrict__ u, int n) {
  int t = (int)(blockIdx.x * blockDim.x + threadIdx.x);
  if (t < n) {
    s[t] = __dp4a(a[t], b[t], 7);
    u[t] = __dp4a((unsigned int)a[t], (unsigned int)b[t], 7u);
  }
}
'''


def test_dp4a_is_four_byte_products_summed():
    rng = np.random.default_rng(0)
    a, b = (rng.integers(-(2 ** 31), 2 ** 31, 1000, dtype=np.int64).astype(np.int32) for _ in range(2))
    d = emulator()
    k = d.build(DP4A, ["dots"])["dots"]
    s, u = d.alloc(4000), d.alloc(4000)
    d.launch(k, [d.upload(a), d.upload(b), s, u, 1000], (4, 1, 1), (256, 1, 1))
    sa, sb = a.view(np.int8).reshape(-1, 4).astype(np.int64), b.view(np.int8).reshape(-1, 4).astype(np.int64)
    ua, ub = a.view(np.uint8).reshape(-1, 4).astype(np.int64), b.view(np.uint8).reshape(-1, 4).astype(np.int64)
    np.testing.assert_array_equal(d.download(s, 1000, np.int32), ((sa * sb).sum(1) + 7).astype(np.int32))
    np.testing.assert_array_equal(d.download(u, 1000, np.uint32), ((ua * ub).sum(1) + 7).astype(np.uint32))


ATOMICS = HEADER + r'''
extern "C" __global__ void tickets(int* __restrict__ counter, int* __restrict__ old, unsigned int* __restrict__ sums) {
  int t = (int)(blockIdx.x * blockDim.x + threadIdx.x);
  __threadfence();
  old[t] = atomicAdd(&counter[t % 3], 2);
  atomicAdd(&sums[0], (unsigned int)t);
}
'''


@pytest.mark.parametrize("order", ["forward", "reverse", "shuffle"])
def test_atomic_adds_are_indivisible_and_return_the_old_value(order):
    """atomicAdd (int and unsigned) as CUDA documents it: the value before the add, each add seen by the next; the
    old values of one counter are then 0, 2, 4, ... in some order (the order the blocks and threads ran), and the
    sums whole (schedule/attention.py's last-block combine counts its blocks so)."""
    d = emulator(order)
    k = d.build(ATOMICS, ["tickets"])["tickets"]
    counter, old, sums = d.alloc(12), d.alloc(4 * 1024), d.alloc(4)
    d.launch(k, [counter, old, sums], (4, 1, 1), (256, 1, 1))
    got = d.download(old, 1024, np.int32)
    for c in range(3):
        mine = np.sort(got[np.arange(1024) % 3 == c])
        np.testing.assert_array_equal(mine, 2 * np.arange(mine.size))
    assert list(d.download(counter, 3, np.int32)) == [2 * 342, 2 * 341, 2 * 341]
    assert int(d.download(sums, 1, np.uint32)[0]) == 1023 * 1024 // 2
    if order != "forward":  # the threads' order shows in who got which ticket
        assert not np.array_equal(got[::3], 2 * np.arange(342))


# ---- tensor cores: nvcuda::wmma, tf32 m16n16k8, against a numpy model ------------------------------------------------

WMMA = HEADER + "#include <mma.h>\n" + r'''
using namespace nvcuda;
// each warp: D (16 x 16, row-major, ldm 20) = A (16 x 8, row-major, ldm 12) x B (8 x 16, B col-major: element (k, n)
// at n * 12 + k) + C (16 x 16, col-major, ldm 20), the inputs rounded to tf32 elementwise in their fragments
extern "C" __global__ void wmma_tf32(const float* __restrict__ a, const float* __restrict__ b,
                                     const float* __restrict__ c, float* __restrict__ d, float* __restrict__ r) {
  int w = (int)threadIdx.x / 32;
  wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::col_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 8, float> fc, fd;
  wmma::load_matrix_sync(fa, a + w * 16 * 12, 12);
  wmma::load_matrix_sync(fb, b + w * 16 * 12, 12);
  wmma::load_matrix_sync(fc, c + w * 16 * 20, 20, wmma::mem_col_major);
  for (int e = 0; e < fa.num_elements; e++) fa.x[e] = wmma::__float_to_tf32(fa.x[e]);
  for (int e = 0; e < fb.num_elements; e++) fb.x[e] = wmma::__float_to_tf32(fb.x[e]);
  wmma::mma_sync(fd, fa, fb, fc);
  wmma::store_matrix_sync(d + w * 16 * 20, fd, 20, wmma::mem_row_major);
  if ((int)threadIdx.x % 32 == 0) r[threadIdx.x / 32] = wmma::__float_to_tf32(a[w * 16 * 12 + 1]);
  wmma::fill_fragment(fd, 2.5f);
  wmma::store_matrix_sync(d + 64 * 20 + w * 16 * 16, fd, 16, wmma::mem_col_major);
}
'''


def tf32_model(x: np.ndarray) -> np.ndarray:
    """PTX cvt.rna.tf32.f32: to 10 mantissa bits, to nearest, ties away from zero; NaN and infinity kept."""
    u = x.astype(np.float32).view(np.uint32)
    special = (u & 0x7F800000) == 0x7F800000
    out = np.where(special, u, (u + np.uint32(0x1000)) & np.uint32(0xFFFFE000))
    return out.astype(np.uint32).view(np.float32)


def test_tf32_rounding_is_to_nearest_ties_away():
    bits = np.array([0x3F800FFF, 0x3F801000, 0x3F802000, 0x3F803000, 0xBF801000, 0x7F7FF000, 0x7FC00001, 0xFF800000,
                     0x00001000, 0x3F800000], np.uint32)
    x = bits.view(np.float32)
    want = tf32_model(x).view(np.uint32)
    assert [hex(v) for v in want[:6]] == ["0x3f800000", "0x3f802000", "0x3f802000", "0x3f804000", "0xbf802000",
                                          "0x7f800000"]  # ties go away from zero; the largest floats round to inf
    src = HEADER + "#include <mma.h>\n" + r'''
extern "C" __global__ void cvt(const float* __restrict__ x, float* __restrict__ y, int n) {
  int t = (int)threadIdx.x;
  if (t < n) y[t] = nvcuda::wmma::__float_to_tf32(x[t]);
}
'''
    rng = np.random.default_rng(3)
    x = np.concatenate([x, rng.standard_normal(4000).astype(np.float32) * 1e3])
    d = emulator()
    k = d.build(src, ["cvt"])["cvt"]
    y = d.alloc(x.size * 4)
    for lo in range(0, x.size, 1024):
        part = x[lo:lo + 1024]
        d.launch(k, [d.upload(part), y, part.size], (1, 1, 1), (1024, 1, 1))
        got = d.download(y, (part.size,), np.float32).view(np.uint32)
        np.testing.assert_array_equal(got, tf32_model(part).view(np.uint32))


@pytest.mark.parametrize("order", ["forward", "shuffle"])
def test_wmma_tf32_follows_its_documented_semantics(order):
    """Four warps, each D = A x B + C on its own tiles, in the layouts and leading dimensions CUDA's wmma API takes;
    the numpy model rounds A and B to tf32 and sums in float64 (the emulation's float sums are within 1e-6)."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((4, 16, 12)).astype(np.float32)
    b = rng.standard_normal((4, 16, 12)).astype(np.float32)  # per warp: row n holds B's column n (k = 0..7)
    c = rng.standard_normal((4, 16, 20)).astype(np.float32)  # per warp: row n holds C's column n
    d = emulator(order)
    k = d.build(WMMA, ["wmma_tf32"])["wmma_tf32"]
    out, r = d.alloc((64 * 20 + 64 * 16) * 4), d.alloc(16)
    d.launch(k, [d.upload(a), d.upload(b), d.upload(c), out, r], (1, 1, 1), (128, 1, 1))
    got = d.download(out, (64 * 20 + 64 * 16,), np.float32)
    A = tf32_model(a[:, :, :8]).astype(np.float64)
    B = tf32_model(b[:, :, :8]).astype(np.float64).transpose(0, 2, 1)  # (k, n)
    C = c[:, :, :16].astype(np.float64).transpose(0, 2, 1)  # (m, n)
    want = A @ B + C
    np.testing.assert_allclose(got[:64 * 20].reshape(4, 16, 20)[:, :, :16], want, atol=1e-5, rtol=1e-6)
    np.testing.assert_array_equal(got[64 * 20:], 2.5)
    np.testing.assert_array_equal(d.download(r, (4,), np.float32), tf32_model(a[:, 0, 1]))


def test_the_wmma_kernel_is_cuda():
    """The kernel the model above holds the emulation to compiles with nvcc for both presets' GPUs (tensor-core PTX)."""
    from conftest import require_nvcc

    from deploycc.runtime.devices.cuda import compile_cuda, ptxas_check

    require_nvcc()
    for arch in ("sm_90", "sm_89"):
        ptx = compile_cuda(WMMA, arch)
        assert "mma.sync" in ptx and set(ptxas_check(ptx, arch)) == {"wmma_tf32"}


def test_wmma_calls_every_lane_must_reach():
    """A wmma call is collective over the warp: a lane that skips it (here: the upper half of each warp) is reported."""
    src = WMMA.replace("  wmma::mma_sync(fd, fa, fb, fc);",
                       "  if ((int)threadIdx.x % 32 < 16) wmma::mma_sync(fd, fa, fb, fc);")
    d = emulator()
    k = d.build(src, ["wmma_tf32"])["wmma_tf32"]
    with pytest.raises(DeviceError, match=r"warp 0: lane 0 waits at the warp primitive of line \d+ while lane 16 "
                                          r"waits at another line: every lane of the warp must reach it"):
        d.launch(k, [d.alloc(4 * 16 * 12 * 4), d.alloc(4 * 16 * 12 * 4), d.alloc(4 * 16 * 20 * 4),
                     d.alloc((64 * 20 + 64 * 16) * 4), d.alloc(16)], (1, 1, 1), (128, 1, 1))


# ---- tensor cores: m16n16k16 with bfloat16 and half inputs (schedule/mma.py: codes_rule) ------------------------------

WMMA16 = HEADER + "#include <cuda_bf16.h>\n#include <mma.h>\n" + r'''
using namespace nvcuda;
// each warp: D (16 x 16, row-major, ldm 20) = A (16 x 16, row-major, ldm 24) x B (16 x 16, col-major: element (k, n)
// at n * 24 + k) + C (16 x 16, row-major, ldm 20), once in bfloat16 and once in half; the float inputs converted
// to the 16-bit types by every thread for its own elements, into shared memory
extern "C" __global__ void wmma16(const float* __restrict__ a, const float* __restrict__ b, const float* __restrict__ c,
                                  float* __restrict__ d) {
  __shared__ __align__(32) __nv_bfloat16 ab[4 * 16 * 24], bb[4 * 16 * 24];
  __shared__ __align__(32) half ah[4 * 16 * 24], bh[4 * 16 * 24];
  int w = (int)threadIdx.x / 32;
  for (int i = (int)threadIdx.x; i < 4 * 16 * 24; i += (int)blockDim.x) {
    ab[i] = __float2bfloat16(a[i]);
    bb[i] = __float2bfloat16(b[i]);
    ah[i] = __float2half(a[i]);
    bh[i] = __float2half(b[i]);
  }
  __syncthreads();
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> fab;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> fbb;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> fah;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> fbh;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc, fd;
  wmma::load_matrix_sync(fab, ab + w * 16 * 24, 24);
  wmma::load_matrix_sync(fbb, bb + w * 16 * 24, 24);
  wmma::load_matrix_sync(fah, ah + w * 16 * 24, 24);
  wmma::load_matrix_sync(fbh, bh + w * 16 * 24, 24);
  wmma::load_matrix_sync(fc, c + w * 16 * 20, 20, wmma::mem_row_major);
  wmma::mma_sync(fd, fab, fbb, fc);
  wmma::store_matrix_sync(d + w * 16 * 20, fd, 20, wmma::mem_row_major);
  wmma::mma_sync(fd, fah, fbh, fc);
  wmma::store_matrix_sync(d + 64 * 20 + w * 16 * 20, fd, 20, wmma::mem_col_major);
}
'''


def bf16_model(x: np.ndarray) -> np.ndarray:
    """cuda_bf16.h's __float2bfloat16: the top 16 bits of the float rounded to nearest, ties to even; NaN stays NaN
    (quiet), large finite floats round to inf."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16
    out = np.where(nan, ((u >> 16) | 0x40) << 16, rounded) & 0xFFFFFFFF
    return out.astype(np.uint32).view(np.float32)


def test_bfloat16_conversions_are_cuda_bf16s():
    """Ties to even both ways, the overflow edge, inf and NaN, and a million random bit patterns, against the model
    above; the model itself pinned on the cases CUDA's documentation gives (1 + 2^-8 is a tie: to 1)."""
    ties = np.array([0x3F808000, 0x3F818000, 0xBF808000, 0x7F7F8000, 0x7F7F7FFF, 0x7F800000, 0xFF800000, 0x7F800001,
                     0x00008000, 0x00018000], np.uint32)
    want_ties = bf16_model(ties.view(np.float32)).view(np.uint32) >> 16
    assert [hex(v) for v in want_ties[:7]] == ["0x3f80", "0x3f82", "0xbf80", "0x7f80", "0x7f7f", "0x7f80", "0xff80"]
    rng = np.random.default_rng(2)
    x = np.concatenate([ties.view(np.float32),
                        rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint64).astype(np.uint32).view(np.float32)])
    src = HEADER + "#include <cuda_bf16.h>\n" + r'''
extern "C" __global__ void bf(const float* __restrict__ x, __nv_bfloat16* __restrict__ h, float* __restrict__ back,
                              int n) {
  int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) { h[i] = __float2bfloat16(x[i]); back[i] = __bfloat162float(h[i]); }
}
'''
    d = emulator()
    k = d.build(src, ["bf"])["bf"]
    h, back = d.alloc(x.size * 2), d.alloc(x.size * 4)
    d.launch(k, [d.upload(x), h, back, x.size], (-(-x.size // 256), 1, 1), (256, 1, 1))
    want = bf16_model(x).view(np.uint32)
    np.testing.assert_array_equal(d.download(h, x.size, np.uint16), (want >> 16).astype(np.uint16))
    np.testing.assert_array_equal(d.download(back, x.size, np.float32).view(np.uint32), want)


@pytest.mark.parametrize("order", ["forward", "shuffle"])
def test_wmma_16bit_follows_its_documented_semantics(order):
    """Four warps, each D = A x B + C in m16n16k16 with bfloat16 and with half inputs (the same float tiles converted
    each way), in the layouts and leading dimensions CUDA's wmma API takes; the numpy model converts A and B
    (bf16_model, numpy's float16) and sums in float64 (the emulation's float sums are within 1e-6)."""
    rng = np.random.default_rng(4)
    a = rng.standard_normal((4, 16, 24)).astype(np.float32)
    b = rng.standard_normal((4, 16, 24)).astype(np.float32)  # per warp: row n holds B's column n (k = 0..15)
    c = rng.standard_normal((4, 16, 20)).astype(np.float32)
    d = emulator(order)
    k = d.build(WMMA16, ["wmma16"])["wmma16"]
    out = d.alloc(2 * 64 * 20 * 4)
    d.launch(k, [d.upload(a), d.upload(b), d.upload(c), out], (1, 1, 1), (128, 1, 1))
    got = d.download(out, (2, 4, 16, 20), np.float32)
    C = c[:, :, :16].astype(np.float64)
    row_major = got[0][:, :, :16]  # (m, n) at m * 20 + n
    col_major = got[1].transpose(0, 2, 1)[:, :16, :]  # (m, n) at n * 20 + m
    for convert, part in ((bf16_model, row_major), (lambda x: x.astype(np.float16), col_major)):
        A = convert(a[:, :, :16]).astype(np.float64)
        B = convert(b[:, :, :16]).astype(np.float64).transpose(0, 2, 1)  # (k, n)
        np.testing.assert_allclose(part, A @ B + C, atol=1e-5, rtol=1e-6)
    # the types matter: bfloat16's 8 bits against half's 11 are off by far more than the tolerance
    assert np.abs(row_major - col_major).max() > 1e-3


@pytest.mark.parametrize("change,reason", [
    ("wmma::load_matrix_sync(fab, ab + w * 16 * 24, 24);", "wmma::load_matrix_sync(fab, ab + w * 16 * 24 + 8, 24);"),
    ("wmma::load_matrix_sync(fc, c + w * 16 * 20, 20, wmma::mem_row_major);",
     "wmma::load_matrix_sync(fc, c + w * 16 * 20, 18, wmma::mem_row_major);"),
])
def test_wmma_pointers_and_leading_dimensions_are_checked(change, reason):
    """CUDA requires a fragment's pointer 256-bit aligned and its leading dimension a multiple of 16 bytes; the
    emulation fails a launch that breaks either (here 16 bytes off, and 18 floats)."""
    d = emulator()
    k = d.build(WMMA16.replace(change, reason), ["wmma16"])["wmma16"]
    why = "pointer is not 256-bit aligned" if "+ 8" in reason else "leading dimension is not a multiple of 16 bytes"
    with pytest.raises(DeviceError, match=why):
        d.launch(k, [d.alloc(4 * 16 * 24 * 4), d.alloc(4 * 16 * 24 * 4), d.alloc(4 * 16 * 20 * 4),
                     d.alloc(2 * 64 * 20 * 4)], (1, 1, 1), (128, 1, 1))


def test_the_16bit_wmma_kernel_is_cuda():
    """The kernel the model above holds the emulation to compiles with nvcc for both presets' GPUs."""
    from conftest import require_nvcc

    from deploycc.runtime.devices.cuda import compile_cuda, ptxas_check

    require_nvcc()
    for arch in ("sm_90", "sm_89"):
        ptx = compile_cuda(WMMA16, arch)
        assert "mma.sync" in ptx and ".bf16" in ptx and set(ptxas_check(ptx, arch)) == {"wmma16"}
