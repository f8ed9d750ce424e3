"""What a WebGPU package needs of an adapter (manifest kernels.requires, targets/webgpu_limits.py): stated in the
spec's limit names, within the defaults every WebGPU implementation guarantees for chrome-webgpu, refused at
compile when a buffer exceeds the target's max_buffer_size, and at load when the adapter allows less (one line
naming the limit, the need, the adapter's value and the preset key). The validator checks requires and the kernel
variants' files (file_no_f16, file_subgroups, file_no_f16_subgroups)."""
from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest
from conftest import require_device
from tiny_package import compile_tiny_package, read_docs

from deploycc import DeployError, presets
from deploycc.package import compile_model
from deploycc.runtime.devices.webgpu import LIMITS, snake
from deploycc.runtime.package import PackageError
from fixtures import make_tiny

# The WebGPU spec's default limits: what every adapter allows without asking (and Chrome gives by default).
DEFAULTS = {"maxComputeInvocationsPerWorkgroup": 256, "maxComputeWorkgroupSizeX": 256,
            "maxComputeWorkgroupStorageSize": 16384, "maxStorageBuffersPerShaderStage": 8,
            "maxStorageBufferBindingSize": 134217728, "maxBufferSize": 268435456,
            "maxComputeWorkgroupsPerDimension": 65535}


@pytest.fixture(scope="module")
def webgpu_pkg(tmp_path_factory) -> Path:
    return compile_tiny_package(tmp_path_factory.mktemp("limits"), "chrome-webgpu")


def test_chrome_preset_is_within_the_webgpu_defaults():
    t = presets.load("chrome-webgpu").target
    assert set(DEFAULTS) == set(LIMITS)
    for limit, default in DEFAULTS.items():
        assert getattr(t, LIMITS[limit]) <= default, limit


@pytest.mark.parametrize("quant", ["q0f32", "q4f16_1"])
def test_requires_states_what_the_package_allocates_and_binds(tmp_path, quant):
    out = compile_model(str(make_tiny("llama-gqa1")), "chrome-webgpu", quantization=quant, out=str(tmp_path / "pkg"),
                        context_window=32)
    m = json.loads((out / "manifest.json").read_text())
    req = m["kernels"]["requires"]
    assert set(req) == set(LIMITS)
    assert all(req[k] <= v for k, v in DEFAULTS.items()), req
    entries = m["kernels"]["entries"].values()
    assert req["maxComputeInvocationsPerWorkgroup"] == req["maxComputeWorkgroupSizeX"] == max(e["threads"] for e in entries)
    assert req["maxStorageBuffersPerShaderStage"] == max(
        len(e["args"]["buffers"]) + sum(n - 1 for _, n in e.get("split", {}).values()) for e in entries)
    kv = m["kv_cache"]
    buffers = [s["bytes"] for s in m["storages"]] + [math.prod(p["shape"]) * (2 if p["dtype"] == "float16" else 4)
                                                     for p in m["params"]]
    buffers.append(kv["pool"]["pages"] * kv["pool"]["page_size"] * kv["kv_heads"] * kv["head_dim"] * 4)
    assert req["maxBufferSize"] == max(-(-b // 4) * 4 for b in buffers)
    assert req["maxStorageBufferBindingSize"] == req["maxBufferSize"]  # nothing is split at 128 MiB


def test_requires_counts_split_ranges(tmp_path):
    """Weights over max_storage_binding are bound in ranges: more bindings, none larger than a range (4096 bytes;
    the KV-cache layers and activations of 4-token steps are smaller), while the largest weight is 14336."""
    out = compile_model(str(make_tiny("llama-gqa1")), "cpu-webgpu", out=str(tmp_path / "pkg"), context_window=32,
                        overrides=("target.max_storage_binding=4096", "prefill_chunk=4"))
    m = json.loads((out / "manifest.json").read_text())
    req, entries = m["kernels"]["requires"], m["kernels"]["entries"].values()
    split = [e for e in entries if "split" in e]
    assert split and req["maxStorageBuffersPerShaderStage"] == max(
        len(e["args"]["buffers"]) + sum(n - 1 for _, n in e.get("split", {}).values()) for e in entries)
    assert req["maxStorageBufferBindingSize"] == 4096 and req["maxBufferSize"] == 14336


# llama-gqa1 at a context window of 32 and 4-token steps: its largest buffer is the merged gate/up weight (14336
# bytes); at 128 tokens, a KV-cache layer (16384, float32: chrome-webgpu's float16 cache would take half); with
# 32-token steps, an activation storage (14336).
@pytest.mark.parametrize("ctx,chunk,limit,fragment,hint", [
    (32, 4, 8192, r"weight \w+ of kernel \w+ takes 14336 bytes", "choose a smaller --quantization"),
    (128, 4, 15000, "KV cache of layer 0 takes 16384 bytes", "lower --context-window"),
    (32, 32, 14000, "storage 3 takes 14336 bytes", "lower prefill_chunk"),
], ids=["weight", "KV cache", "storage"])
def test_a_buffer_over_max_buffer_size_is_a_compile_error(tmp_path, ctx, chunk, limit, fragment, hint):
    out = tmp_path / "pkg"
    with pytest.raises(DeployError, match=rf"^{fragment}, more than the target's max_buffer_size {limit} "
                                          rf"\(WebGPU's maxBufferSize\); {hint}") as e:
        compile_model(str(make_tiny("llama-gqa1")), "chrome-webgpu", "q0f32", out=str(out), context_window=ctx,
                      overrides=(f"target.max_buffer_size={limit}", f"prefill_chunk={chunk}", "kv_cache=float32"))
    assert "\n" not in str(e.value) and not out.exists()


# ---- at load --------------------------------------------------------------------------------------

def edited(pkg: Path, dst: Path, change) -> Path:
    from bad_inputs.common import reseal

    shutil.copytree(pkg, dst)
    m = json.loads((dst / "manifest.json").read_text())
    change(m)
    (dst / "manifest.json").write_text(json.dumps(m))
    reseal(dst)
    return dst


def test_snake_names_are_wgpu_limits():
    device = require_device("webgpu")
    assert snake("maxComputeWorkgroupSizeX") == "max_compute_workgroup_size_x"
    assert all(snake(k) in device.limits for k in LIMITS)


def test_a_package_needing_more_than_the_adapter_is_refused(webgpu_pkg, tmp_path):
    from bad_inputs.common import assert_one_line_error, run_package

    from deploycc.runtime.devices import DeviceError
    from deploycc.runtime.engine import Engine

    device = require_device("webgpu")
    have = device.limits["max_storage_buffers_per_shader_stage"]
    pkg = edited(webgpu_pkg, tmp_path / "pkg",
                 lambda m: m["kernels"]["requires"].update(maxStorageBuffersPerShaderStage=have + 1))
    want = (f"this package needs maxStorageBuffersPerShaderStage {have + 1}, adapter {device.name} allows {have}; "
            f"compile for a preset with max_storage_buffers: {have}")
    with pytest.raises(DeviceError) as e:
        Engine.load(pkg)
    assert str(e.value) == want
    assert_one_line_error(run_package(pkg, "run", "--prompt", "hi", timeout=120), want)


def test_a_package_without_requires_loads(webgpu_pkg, tmp_path):
    """Packages from before kernels.requires are not checked."""
    from deploycc.runtime.engine import Engine

    require_device("webgpu")
    pkg = edited(webgpu_pkg, tmp_path / "pkg", lambda m: m["kernels"].pop("requires"))
    assert Engine.load(pkg).prefill([1, 2, 3]).shape == (101,)


# ---- the validator --------------------------------------------------------------------------------

def _entry(m):
    return next(iter(m["kernels"]["entries"].values()))


def _listed(m, rel):
    m["files"][rel] = "0" * 64
    _entry(m)["file_no_f16"] = rel


BAD = [
    ("unknown limit", lambda m: m["kernels"]["requires"].update(maxFrobs=1), "kernels.requires has 'maxFrobs', not one of"),
    ("limit a string", lambda m: m["kernels"]["requires"].update(maxBufferSize="1"),
     "kernels.requires.maxBufferSize must be an integer"),
    ("requires a list", lambda m: m["kernels"].update(requires=[1]), "kernels.requires must be an object"),
    ("file_no_f16 not listed", lambda m: _entry(m).update(file_no_f16="kernels/x.nof16.wgsl"),
     "file_no_f16 is 'kernels/x.nof16.wgsl', not a .wgsl file of the package's kernels/ listed in files"),
    ("file_no_f16 not WGSL", lambda m: _listed(m, "kernels/x.nof16.cl"), "not a .wgsl file"),
    ("file_no_f16 outside kernels/", lambda m: _listed(m, "params/x.wgsl"), "not a .wgsl file"),
    ("file_no_f16 a number", lambda m: _entry(m).update(file_no_f16=3), "file_no_f16 must be a string"),
    ("file_subgroups not listed", lambda m: _entry(m).update(file_subgroups="kernels/x.sg.wgsl"),
     "file_subgroups is 'kernels/x.sg.wgsl', not a .wgsl file of the package's kernels/ listed in files"),
    ("file_no_f16_subgroups without file_no_f16", lambda m: (_entry(m).pop("file_no_f16", None),
                                                             _entry(m).update(file_no_f16_subgroups=_entry(m)["file"])),
     "file_no_f16_subgroups is the subgroup variant of file_no_f16, which the entry lacks"),
]


@pytest.mark.parametrize("change,fragment", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_validator_refuses(webgpu_pkg, change, fragment):
    from deploycc.runtime.validate import check_manifest

    m, _ = read_docs(webgpu_pkg)
    check_manifest(m)
    change(m)
    with pytest.raises(PackageError, match=re.escape(fragment)):
        check_manifest(m)


def test_webgpu_fields_in_an_opencl_package_are_refused(tmp_path):
    from deploycc.runtime.validate import check_manifest

    m, _ = read_docs(compile_tiny_package(tmp_path, "cpu-opencl"))
    e = _entry(m)
    e["file_no_f16"] = e["file"]
    with pytest.raises(PackageError, match="file_no_f16 is a WebGPU kernel variant, but the package is for opencl"):
        check_manifest(m)
    del e["file_no_f16"]
    m["kernels"]["requires"] = dict(DEFAULTS)
    with pytest.raises(PackageError, match="kernels.requires states WebGPU limits, but the package is for opencl"):
        check_manifest(m)
