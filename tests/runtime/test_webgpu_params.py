"""Where a WebGPU kernel's Params are bound (runtime/devices/webgpu.py): a read-only storage buffer on lavapipe, whose
22.3 driver otherwise inlines a uniform read by a loop bound or a branch and rebuilds the shader at every dispatch
whose values differ (the split attention's combine: ~10x its launch time at up to 256 keys), a uniform elsewhere;
DEPLOYCC_WEBGPU_PARAMS or `params=` chooses either on any adapter, and a kernel whose storage bindings reach the
adapter's limit keeps its uniform. Results are the same either way."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import require_device

from deploycc.package import compile_model
from deploycc.runtime.devices import DeviceError
from deploycc.runtime.devices.webgpu import PARAMS_ENV, WebGPUDevice
from fixtures import make_tiny

X = np.arange(1, 33, dtype=np.float32) / 8  # the looped kernel's input
LOOP = """@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
struct Params {
  n: i32,
  m: i32,
}
@group(0) @binding(2) var<uniform> params: Params;
@compute @workgroup_size(64)
fn looped(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let t = i32(lid.x) + 64 * i32(wid.x);
  if (t < params.m) {
    var acc: f32 = 0.0;
    for (var s: i32 = 0; s < params.n; s++) {
      acc = acc + x[s] * f32(t + 1);
    }
    y[t] = acc;
  }
}
"""


def many_buffers(n: int) -> str:
    """A kernel with n storage bindings (n - 1 read, the last written) and Params: y = the sum of x0[t].. at t < m."""
    decls = "".join(f"@group(0) @binding({i}) var<storage, read> x{i}: array<f32>;\n" for i in range(n - 1))
    total = " + ".join(f"x{i}[t]" for i in range(n - 1))
    return (decls + f"@group(0) @binding({n - 1}) var<storage, read_write> y: array<f32>;\n"
            "struct Params {\n  m: i32,\n}\n"
            f"@group(0) @binding({n}) var<uniform> params: Params;\n"
            "@compute @workgroup_size(64)\n"
            "fn many(@builtin(local_invocation_id) lid: vec3<u32>) {\n"
            "  let t = i32(lid.x);\n"
            f"  if (t < params.m) {{\n    y[t] = {total};\n  }}\n}}\n")


@pytest.fixture(scope="module")
def lavapipe():
    device = require_device("webgpu")
    if "llvmpipe" not in device.name.lower():
        pytest.skip(f"the adapter is {device.name}, not lavapipe: its Params stay uniform")
    return device


def run_loop(device: WebGPUDevice, n: int, m: int) -> np.ndarray:
    k = device.build(LOOP, ["looped"])["looped"]
    xb, yb = device.upload(X), device.alloc(4 * 128)
    device.launch(k, [xb, yb, n, m], (2, 1, 1), (64, 1, 1))
    return device.download(yb, (128,), np.float32)


def test_lavapipe_binds_params_as_storage_and_the_results_agree(lavapipe, monkeypatch):
    """On lavapipe the default is storage; a loop whose bound is a Params value gives the same outputs, bit for bit,
    as with the uniform, at trip counts of 1, 2 and 32 in either order (the uniform's inlined variants among them)."""
    assert lavapipe.params == "storage"
    monkeypatch.setenv(PARAMS_ENV, "uniform")
    uniform = WebGPUDevice()
    assert uniform.params == "uniform"
    monkeypatch.delenv(PARAMS_ENV)
    storage = WebGPUDevice()
    assert storage.params == "storage"
    for n, m in ((1, 100), (32, 128), (2, 7), (1, 100)):
        want = np.zeros(128, np.float32)
        want[:m] = np.float32(X[:n].sum()) * (np.arange(m, dtype=np.float32) + 1)
        for device in (storage, uniform):
            got = run_loop(device, n, m)
            np.testing.assert_allclose(got, want, rtol=1e-6)
        np.testing.assert_array_equal(run_loop(storage, n, m), run_loop(uniform, n, m))


@pytest.mark.parametrize("given, env, named", [("push", None, "params"), (None, "ubo", PARAMS_ENV)])
def test_a_bad_params_choice_is_one_line(monkeypatch, given, env, named):
    """A bad `params=` or $DEPLOYCC_WEBGPU_PARAMS: a one-line error naming it, its value and the two choices."""
    require_device("webgpu")
    if env is not None:
        monkeypatch.setenv(PARAMS_ENV, env)
    with pytest.raises(DeviceError, match=rf"{named} is '{given or env}'; set it to uniform or storage") as e:
        WebGPUDevice(params=given)
    assert "\n" not in str(e.value)


def test_a_kernel_at_the_storage_limit_keeps_its_uniform(lavapipe):
    """With as many storage bindings as the adapter allows, a Params storage binding would be one too many: the
    kernel builds with its uniform and runs; one binding fewer takes the storage."""
    limit = lavapipe.limits["max_storage_buffers_per_shader_stage"]
    for n, params_type in ((limit, "uniform"), (limit - 1, "read-only-storage")):
        source = many_buffers(n)
        k = lavapipe.build(source, ["many"])["many"]
        assert k.meta["params_type"] == params_type
        xs = [lavapipe.upload(np.full(64, i + 1, np.float32)) for i in range(n - 1)]
        y = lavapipe.alloc(4 * 64)
        lavapipe.launch(k, [*xs, y, 40], (1, 1, 1), (64, 1, 1))
        got = lavapipe.download(y, (64,), np.float32)
        want = np.where(np.arange(64) < 40, (n - 1) * n / 2, 0).astype(np.float32)
        np.testing.assert_array_equal(got, want)


def test_a_package_decodes_alike_with_either_binding(tmp_path, monkeypatch, lavapipe):
    """A tiny Llama on cpu-webgpu, 80 tokens of prompt then 24 decode steps (its split decode attention's combine
    at one split of 128 keys, the case lavapipe inlines): prefill's and every step's logits within 1e-6 of each other
    with Params as storage (the default here) and as uniform."""
    from deploycc.runtime.engine import Engine

    out = compile_model(str(make_tiny("llama-gqa1")), "cpu-webgpu", quantization="q0f32", out=str(tmp_path / "pkg"),
                        context_window=128)
    ids = [(7 * i) % 97 + 3 for i in range(80)]
    got = {}
    for params in ("storage", "uniform"):
        monkeypatch.setenv(PARAMS_ENV, params)
        engine = Engine.load(out)
        assert engine.device.params == params
        got[params] = np.stack([engine.prefill(ids)] + [engine.decode((5 * i) % 97 + 3) for i in range(24)])
    np.testing.assert_allclose(got["storage"], got["uniform"], atol=1e-6, rtol=0)
