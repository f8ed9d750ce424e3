"""WebGPU backend on lavapipe: hand-written WGSL kernels in the renderer ABI, launched through the device interface."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import missing, require_device, require_module

from deploycc.runtime.devices import DeviceError, available, open_device

wgpu = require_module("wgpu")

ADD2D = """
struct Params { s0: i32, s1: i32, s2: i32, s3: i32 }
@group(0) @binding(0) var<storage, read> b0: array<f32>;
@group(0) @binding(1) var<storage, read> b1: array<f32>;
@group(0) @binding(2) var<storage, read_write> b2: array<f32>;
@group(0) @binding(3) var<uniform> params: Params;

// b2[i, j] = b0[i, j] + b1[i, j] for i < s0 rows, j < s1 cols; row strides s2 (b0), s3 (b1); b2 dense
@compute @workgroup_size(8, 4, 1)
fn add2d(@builtin(global_invocation_id) gid: vec3<u32>) {
    let j = i32(gid.x);
    let i = i32(gid.y);
    if (i < params.s0 && j < params.s1) {
        b2[i * params.s1 + j] = b0[i * params.s2 + j] + b1[i * params.s3 + j];
    }
}
"""

ROWSUM = """
struct Params { s0: i32 }
@group(0) @binding(0) var<storage, read_write> b0: array<i32>;
@group(0) @binding(1) var<storage, read_write> b1: array<i32>;
@group(0) @binding(2) var<uniform> params: Params;
var<workgroup> acc: array<i32, 64>;

// one workgroup per row of s0 ints; tree reduction in workgroup memory
@compute @workgroup_size(64)
fn rowsum(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let row = i32(wg.x);
    let t = i32(lid.x);
    var s = 0;
    for (var j = t; j < params.s0; j += 64) { s += b0[row * params.s0 + j]; }
    acc[t] = s;
    workgroupBarrier();
    for (var w = 32; w > 0; w >>= 1u) {
        if (t < w) { acc[t] += acc[t + w]; }
        workgroupBarrier();
    }
    if (t == 0) { b1[row] = acc[0]; }
}
"""

ADDK = """
struct Params { s0: i32, s1: i32 }
@group(0) @binding(0) var<storage, read_write> b0: array<i32>;
@group(0) @binding(1) var<uniform> params: Params;

@compute @workgroup_size(64)
fn addk(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = i32(gid.x);
    if (i < params.s0) { b0[i] += params.s1; }
}

@compute @workgroup_size(64)
fn double(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = i32(gid.x);
    if (i < params.s0) { b0[i] *= 2; }
}
"""

COPY = """
@group(0) @binding(0) var<storage, read> b0: array<f32>;
@group(0) @binding(1) var<storage, read_write> b1: array<f32>;

@compute @workgroup_size(64)
fn copy(@builtin(global_invocation_id) gid: vec3<u32>) {
    if (gid.x < arrayLength(&b1)) { b1[gid.x] = b0[gid.x]; }
}
"""

F16 = """
enable f16;
struct Params { s0: i32 }
@group(0) @binding(0) var<storage, read> b0: array<f16>;
@group(0) @binding(1) var<storage, read_write> b1: array<f32>;
@group(0) @binding(2) var<storage, read_write> b2: array<f16>;
@group(0) @binding(3) var<uniform> params: Params;

@compute @workgroup_size(64)
fn f16ops(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = i32(gid.x);
    if (i < params.s0) {
        let h = b0[i];
        b1[i] = f32(h);
        b2[i] = h * 2.0h;
    }
}
"""


@pytest.fixture(scope="module")
def dev():
    return require_device("webgpu")


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@pytest.mark.parametrize("rows,cols", [(1, 1), (7, 13), (33, 65), (64, 128), (3, 300)])
def test_strided_add_2d(dev, rows, cols):
    rng = np.random.default_rng(rows * cols)
    a = rng.standard_normal((rows, cols + 3)).astype(np.float32)
    b = rng.standard_normal((rows, cols + 5)).astype(np.float32)
    k = dev.build(ADD2D, ["add2d"])["add2d"]
    ba, bb, bc = dev.upload(a), dev.upload(b), dev.alloc(rows * cols * 4)
    dev.launch(k, [ba, bb, bc, rows, cols, cols + 3, cols + 5], (ceil_div(cols, 8), ceil_div(rows, 4), 1), (8, 4, 1))
    np.testing.assert_array_equal(dev.download(bc, (rows, cols), np.float32), a[:, :cols] + b[:, :cols])


@pytest.mark.parametrize("rows,cols", [(1, 1), (5, 100), (16, 1000), (3, 4097), (2, 7)])
def test_workgroup_memory_reduction(dev, rows, cols):
    x = np.random.default_rng(cols).integers(-1000, 1000, (rows, cols), dtype=np.int32)
    k = dev.build(ROWSUM, ["rowsum"])["rowsum"]
    bx, by = dev.upload(x), dev.alloc(rows * 4)
    dev.launch(k, [bx, by, cols], (rows, 1, 1), (64, 1, 1))
    np.testing.assert_array_equal(dev.download(by, rows, np.int32), x.sum(axis=1, dtype=np.int32))


def test_many_launches_then_one_download(dev):
    ks = dev.build(ADDK, ["addk", "double"])
    n = 1000
    buf = dev.alloc(n * 4)
    expect = np.zeros(n, np.int64)
    for step in range(300):  # different scalars per launch, all in one batch
        if step % 50 == 49:
            dev.launch(ks["double"], [buf, n], (ceil_div(n, 64), 1, 1), (64, 1, 1))
            expect *= 2
        else:
            dev.launch(ks["addk"], [buf, n, step], (ceil_div(n, 64), 1, 1), (64, 1, 1))
            expect += step
    assert dev.pending == 300  # batched, nothing submitted yet
    np.testing.assert_array_equal(dev.download(buf, n, np.int32), expect.astype(np.int32))
    assert dev.pending == 0


def test_params_ride_a_ring_and_bind_groups_are_made_once(monkeypatch):
    """Each launch's Params at a dynamic offset of one uniform ring, written just before its batch is submitted: 2,000
    launches of two kernels of one module on one buffer, most with other scalars, make one bind group, and when the ring is full
    the batch is submitted and the ring starts over (a ring of 40 slots here: 50 submits), every launch seeing its own
    scalars (the sum of them all, in order with the doublings). The negative control: the staged Params written at
    offset 0 whatever the launch's (every launch then reads the first one's) gives another sum."""
    from deploycc.runtime.devices import webgpu

    dev = require_device("webgpu")
    monkeypatch.setattr(webgpu, "RING_BYTES", 40 * int(dev.limits.get("min_uniform_buffer_offset_alignment", 256)))

    def run(d) -> np.ndarray:
        ks = d.build(ADDK, ["addk", "double"])
        buf = d.alloc(64 * 4)
        for step in range(2000):
            if step % 500 == 499:
                d.launch(ks["double"], [buf, 64], (1, 1, 1), (64, 1, 1))
            else:
                d.launch(ks["addk"], [buf, 64, step], (1, 1, 1), (64, 1, 1))
        return d.download(buf, 64, np.int32)
    expect = 0
    for step in range(2000):
        expect = expect * 2 if step % 500 == 499 else expect + step
    fresh = webgpu.WebGPUDevice()
    submits = []
    submit = fresh.queue.submit
    monkeypatch.setattr(fresh.queue, "submit", lambda cbs: (submits.append(1), submit(cbs))[1], raising=False)
    assert (run(fresh) == np.int32(expect)).all() and len(fresh._groups) == 1  # addk and double share a layout
    assert len(submits) >= 2000 // 40
    broken = webgpu.WebGPUDevice()
    monkeypatch.setattr(broken, "_stage", lambda params: (broken._staged.__setitem__(slice(0, len(params)), params), 0)[1])
    assert not (run(broken) == np.int32(expect)).all()


def test_chained_launches_and_write_ordering(dev):
    k = dev.build(COPY, ["copy"])["copy"]
    a = np.arange(1000, dtype=np.float32)
    ba, bb, bc = dev.upload(a), dev.alloc(a.nbytes), dev.alloc(a.nbytes)
    grid = (ceil_div(a.size, 64), 1, 1)
    dev.launch(k, [ba, bb], grid, (64, 1, 1))
    dev.launch(k, [bb, bc], grid, (64, 1, 1))  # reads what the previous dispatch wrote
    dev.write(ba, np.zeros_like(a))  # must not overtake the pending launches
    np.testing.assert_array_equal(dev.download(bc, a.shape, np.float32), a)
    dev.launch(k, [ba, bb], grid, (64, 1, 1))
    dev.synchronize()
    assert dev.pending == 0
    np.testing.assert_array_equal(dev.download(bb, a.shape, np.float32), np.zeros_like(a))


def test_f16_kernel(dev):
    if not dev.has_f16:
        missing(f"adapter {dev.name} has no shader-f16 (install Mesa's lavapipe: mesa-vulkan-drivers)")
    h = (np.random.default_rng(3).standard_normal(1001) * 100).astype(np.float16)  # odd length: padded buffers
    k = dev.build(F16, ["f16ops"])["f16ops"]
    bh, bf, b2 = dev.upload(h), dev.alloc(h.size * 4), dev.alloc(h.nbytes)
    dev.launch(k, [bh, bf, b2, h.size], (ceil_div(h.size, 64), 1, 1), (64, 1, 1))
    np.testing.assert_array_equal(dev.download(bf, h.shape, np.float32), h.astype(np.float32))
    np.testing.assert_array_equal(dev.download(b2, h.shape, np.float16), h * np.float16(2))


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
    k = dev.build(COPY, ["copy"])["copy"]
    dev.launch(k, [empty, empty], (0, 1, 1), (64, 1, 1))  # an empty grid is a no-op
    dev.synchronize()


def test_build_errors(dev):
    with pytest.raises(DeviceError, match="WGSL build failed.*expected") as e:
        dev.build("@compute @workgroup_size(1) fn f( { }", ["f"])
    assert "\n" not in str(e.value)
    with pytest.raises(DeviceError, match="entry point 'nope'"):
        dev.build(COPY, ["nope"])
    with pytest.raises(DeviceError, match="do not follow the ABI"):
        dev.build(COPY.replace("@binding(1)", "@binding(2)"), ["copy"])


def test_abi_violations(dev):
    k = dev.build(ADD2D, ["add2d"])["add2d"]
    b = dev.alloc(16)
    with pytest.raises(DeviceError, match="declares 3 buffers"):
        dev.launch(k, [b, b, 1, 1, 1, 1], (1, 1, 1), (8, 4, 1))
    with pytest.raises(DeviceError, match="differs from the shader's @workgroup_size"):
        dev.launch(k, [b, b, b, 1, 1, 1, 1], (1, 1, 1), (64, 1, 1))
    with pytest.raises(DeviceError, match="max_compute_workgroups_per_dimension"):
        dev.launch(k, [b, b, b, 1, 1, 1, 1], (10**6, 1, 1), (8, 4, 1))
    with pytest.raises(DeviceError, match="bound both `read` and `read_write`"):
        dev.launch(k, [b, b, b, 1, 1, 1, 1], (1, 1, 1), (8, 4, 1))
    with pytest.raises(DeviceError, match="exceeds `max_.*_buffer_binding_size`"):
        big = dev.alloc(dev.limits["max_storage_buffer_binding_size"] + 4)
        dev.launch(k, [big, dev.alloc(16), dev.alloc(16), 1, 1, 1, 1], (1, 1, 1), (8, 4, 1))
    dev.launch(k, [b, dev.alloc(16), dev.alloc(16), 1, 1, 1, 1], (1, 1, 1), (8, 4, 1))
    dev.synchronize()  # nothing invalid reached the batch


def test_adapter_choice_and_limits(dev):
    adapters = [d for d in available() if d["kind"] == "webgpu"]
    assert adapters  # lavapipe and llvmpipe (OpenGL) here; a GPU's Vulkan and OpenGL adapters where it has one
    backends = {d["details"]["backend"] for d in adapters}
    if "Vulkan" in backends:  # Vulkan (lavapipe, a GPU's driver) is preferred over the OpenGL adapters
        assert "Vulkan" in dev.name
        assert dev.has_f16 == any(d["details"]["has_f16"] for d in adapters if d["details"]["backend"] == "Vulkan")
    assert dev.limits["max_storage_buffer_binding_size"] >= 128 << 20
    assert dev.limits["max_compute_invocations_per_workgroup"] >= 256
    with pytest.raises(DeviceError, match="no WebGPU adapter"):
        open_device("webgpu", adapter="no such adapter")
