"""OpenCL backend on PoCL: hand-written OpenCL C kernels in the renderer ABI, launched through the device interface."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import missing, require_device, require_module

from deploycc.runtime.devices import DeviceError, available, open_device

cl = require_module("pyopencl")

ADD2D = """
__kernel void add2d(__global float* b0, __global float* b1, __global float* b2, int s0, int s1, int s2, int s3) {
    /* b2[i, j] = b0[i, j] + b1[i, j] for i < s0 rows, j < s1 cols; row strides s2 (b0), s3 (b1); b2 dense */
    int j = get_global_id(0);
    int i = get_global_id(1);
    if (i < s0 && j < s1) b2[i * s1 + j] = b0[i * s2 + j] + b1[i * s3 + j];
}
"""

ROWSUM = """
__kernel void rowsum(__global int* b0, __global int* b1, int s0) {
    /* one work-group per row of s0 ints; tree reduction in local memory (power-of-two work-group <= 256) */
    __local int acc[256];
    int row = get_group_id(0), t = get_local_id(0), n = get_local_size(0);
    int s = 0;
    for (int j = t; j < s0; j += n) s += b0[row * s0 + j];
    acc[t] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int w = n / 2; w > 0; w >>= 1) {
        if (t < w) acc[t] += acc[t + w];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (t == 0) b1[row] = acc[0];
}
"""

HALF = """
__kernel void widen(__global half* b0, __global float* b1, int s0) {
    /* no cl_khr_fp16 on PoCL: half is storage only, read with vload_half */
    int i = get_global_id(0);
    if (i < s0) b1[i] = vload_half(i, b0);
}
"""


@pytest.fixture(scope="module")
def dev():
    return require_device("opencl")


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@pytest.mark.parametrize("rows,cols,block", [(1, 1, (1, 1)), (7, 13, (4, 4)), (33, 65, (16, 2)), (64, 128, (32, 8)),
                                             (3, 300, (64, 1))])
def test_strided_add_2d(dev, rows, cols, block):
    rng = np.random.default_rng(rows * cols)
    a = rng.standard_normal((rows, cols + 3)).astype(np.float32)  # padded rows: stride cols + 3
    b = rng.standard_normal((rows, cols + 5)).astype(np.float32)
    k = dev.build(ADD2D, ["add2d"])["add2d"]
    ba, bb, bc = dev.upload(a), dev.upload(b), dev.alloc(rows * cols * 4)
    grid = (ceil_div(cols, block[0]), ceil_div(rows, block[1]), 1)
    dev.launch(k, [ba, bb, bc, rows, cols, cols + 3, cols + 5], grid, (*block, 1))
    out = dev.download(bc, (rows, cols), np.float32)
    np.testing.assert_array_equal(out, a[:, :cols] + b[:, :cols])


@pytest.mark.parametrize("rows,cols,block", [(1, 1, 1), (5, 100, 32), (16, 1000, 64), (3, 4097, 256), (2, 7, 128)])
def test_local_memory_reduction(dev, rows, cols, block):
    x = np.random.default_rng(cols).integers(-1000, 1000, (rows, cols), dtype=np.int32)
    k = dev.build(ROWSUM, ["rowsum"])["rowsum"]
    bx, by = dev.upload(x), dev.alloc(rows * 4)
    dev.launch(k, [bx, by, cols], (rows, 1, 1), (block, 1, 1))
    np.testing.assert_array_equal(dev.download(by, rows, np.int32), x.sum(axis=1, dtype=np.int32))


def test_half_storage_read_with_vload_half(dev):
    h = (np.random.default_rng(1).standard_normal(1001) * 100).astype(np.float16)
    k = dev.build(HALF, ["widen"])["widen"]
    bh, bf = dev.upload(h), dev.alloc(h.size * 4)
    dev.launch(k, [bh, bf, h.size], (ceil_div(h.size, 64), 1, 1), (64, 1, 1))
    np.testing.assert_array_equal(dev.download(bf, h.shape, np.float32), h.astype(np.float32))


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.uint32, np.float16])
def test_round_trip(dev, dtype):
    x = (np.random.default_rng(2).standard_normal((3, 5, 7)) * 1000).astype(dtype)
    buf = dev.upload(x)
    assert buf.nbytes == x.nbytes
    np.testing.assert_array_equal(dev.download(buf, x.shape, dtype), x)
    y = x[::-1].copy()
    dev.write(buf, y)
    np.testing.assert_array_equal(dev.download(buf, x.shape, dtype), y)


def test_zero_size_and_zero_fill(dev):
    empty = dev.alloc(0)
    assert empty.nbytes == 0
    assert dev.download(empty, (0,), np.float32).shape == (0,)
    assert dev.download(dev.upload(np.zeros((0, 4), np.float16)), (0, 4), np.float16).shape == (0, 4)
    np.testing.assert_array_equal(dev.download(dev.alloc(10), 5, np.float16), np.zeros(5, np.float16))
    k = dev.build(ADD2D, ["add2d"])["add2d"]
    dev.launch(k, [empty, empty, empty, 0, 0, 0, 0], (0, 1, 1), (8, 8, 1))  # an empty grid is a no-op
    dev.synchronize()


def test_write_is_ordered_after_launches(dev):
    k = dev.build(ADD2D, ["add2d"])["add2d"]
    a = np.arange(1000, dtype=np.float32)
    ba, bc = dev.upload(a), dev.alloc(a.nbytes)
    dev.launch(k, [ba, ba, bc, 1, a.size, a.size, a.size], (ceil_div(a.size, 64), 1, 1), (64, 1, 1))
    dev.write(ba, np.zeros_like(a))
    np.testing.assert_array_equal(dev.download(bc, a.shape, np.float32), a + a)


def test_build_error_shows_the_log(dev):
    with pytest.raises(DeviceError, match="undeclared identifier 'nope'") as e:
        dev.build("__kernel void f(__global float* b0) { b0[0] = nope; }", ["f"])
    assert "\n" not in str(e.value)
    with pytest.raises(DeviceError, match="no kernel 'g'"):
        dev.build(ADD2D, ["g"])
    with pytest.raises(DeviceError, match="unknown OpenCL build option"):
        dev.build(ADD2D, ["add2d"], {"fastmath": True})


def test_program_cache_and_fast_math(dev):
    from deploycc.runtime.devices import opencl

    dev.build(ADD2D, ["add2d"])
    n = len(opencl._PROGRAMS)
    dev.build(ADD2D, ["add2d"])
    assert len(opencl._PROGRAMS) == n
    k = dev.build(ADD2D, ["add2d"], {"fast_math": True})["add2d"]
    assert len(opencl._PROGRAMS) == n + 1
    x = np.ones(8, np.float32)
    bx, by = dev.upload(x), dev.alloc(32)
    dev.launch(k, [bx, bx, by, 1, 8, 8, 8], (1, 1, 1), (8, 1, 1))
    np.testing.assert_array_equal(dev.download(by, 8, np.float32), 2 * x)


def test_abi_violations(dev):
    k = dev.build(ADD2D, ["add2d"])["add2d"]
    b = dev.alloc(16)
    with pytest.raises(DeviceError, match="Buffer after an int"):
        dev.launch(k, [b, b, 1, b, 1, 1, 1], (1, 1, 1), (1, 1, 1))
    with pytest.raises(DeviceError, match="takes 7 arguments, got 4"):
        dev.launch(k, [b, b, b, 1], (1, 1, 1), (1, 1, 1))
    with pytest.raises(DeviceError, match="does not fit in int32"):
        dev.launch(k, [b, b, b, 2**31, 1, 1, 1], (1, 1, 1), (1, 1, 1))
    with pytest.raises(DeviceError, match="cannot read"):
        dev.download(b, 5, np.float32)
    with pytest.raises(DeviceError, match="cannot write"):
        dev.write(b, np.zeros(5, np.float32))


def test_platform_choice():
    pocl = [d for d in available() if d["kind"] == "opencl" and "Portable Computing Language" in d["details"].get("platform", "")]
    if not pocl:
        missing("available() lists no PoCL device (apt-get install pocl-opencl-icd, or pip install 'pyopencl[pocl]')")
    versions = [d["details"]["platform_version"] for d in pocl]
    if any("PoCL 3.1" in v for v in versions):  # Debian's PoCL 3.1 wins over pip's 3.0 by default
        assert "PoCL 3.1" in open_device("opencl").name
        assert next(d for d in pocl if d["details"]["default"])["details"]["platform_version"].find("PoCL 3.1") >= 0
    if any("PoCL 3.0" in v for v in versions):
        assert "PoCL 3.0" in open_device("opencl", platform="PoCL 3.0").name
    with pytest.raises(DeviceError, match="no OpenCL platform matches"):
        open_device("opencl", platform="no such platform")
    with pytest.raises(DeviceError, match="no index 9"):
        open_device("opencl", device=9)


def test_launch_site_rebinds_only_what_changed_and_stays_correct(dev):
    """A launch site keeps its arguments bound between launches (decode replay): each call must still
    see the buffers and scalars it is given, whichever of them changed since the last call."""
    site = dev.launcher(dev.build(ADD2D, ["add2d"])["add2d"])
    a = [np.arange(12, dtype=np.float32).reshape(3, 4) * k for k in (1, 10)]
    bufs = [dev.upload(x) for x in a]
    out = [dev.alloc(48), dev.alloc(48)]
    for b0, b1, o, rows in [(0, 1, 0, 3), (0, 1, 0, 3), (1, 1, 1, 3), (1, 0, 0, 2), (0, 0, 1, 1)]:
        dev.write(out[o], np.full((3, 4), -1, np.float32))
        site([bufs[b0], bufs[b1], out[o]], [rows, 4, 4, 4], (4, rows, 1), (1, 1, 1))
        got = dev.download(out[o], (3, 4), np.float32)
        np.testing.assert_array_equal(got[:rows], a[b0][:rows] + a[b1][:rows])
        assert (got[rows:] == -1).all()
    with pytest.raises(DeviceError, match="takes 7 arguments"):
        dev.launcher(dev.build(ADD2D, ["add2d"])["add2d"])([bufs[0]], [1], (1, 1, 1), (1, 1, 1))
