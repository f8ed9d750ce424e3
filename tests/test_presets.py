"""Device presets: every YAML in configs/ loads; schema errors are DeployErrors that say precisely what is wrong."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from deploycc import presets
from deploycc.errors import DeployError
from deploycc.package import apply_overrides

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
GOOD = """\
name: mine
description: a test preset
target:
  kind: opencl
  max_threads_per_block: 256
  threads_per_block: 64
runtime:
  backend: opencl
quantization: q0f32
context_window: 1024
prefill_chunk: 128
"""


def test_names_are_the_yaml_files():
    assert presets.names() == sorted(p.stem for p in CONFIGS.glob("*.yaml"))
    assert {"cpu-opencl", "cpu-webgpu", "h100"} <= set(presets.names())


@pytest.mark.parametrize("name", presets.names())
def test_every_preset_loads(name):
    p = presets.load(name)
    assert p.name == name
    assert p.description
    assert p.target.kind in ("opencl", "webgpu", "cuda", "cpu")
    assert p.backend in presets.BACKENDS
    assert p.backend == p.target.kind  # every shipped preset runs its kernels on the matching runtime
    # cpu: integer GEMVs need 4/8 bits; a browser bundle and a GPU (MLC's default) take 4-bit weights; the presets of
    # the CPU's own OpenCL and WebGPU drivers (the tests' devices) keep float weights
    software = name in ("cpu-opencl", "cpu-webgpu")
    assert p.quantization == ("q4f16_2" if p.target.kind == "cpu" else "q0f32" if software else "q4f16_1")
    assert p.context_window >= 1024 and 1 <= p.prefill_chunk <= p.context_window
    assert p.target.threads_per_block <= p.target.max_threads_per_block


def test_a_preset_file_loads(tmp_path):
    f = tmp_path / "mine.yaml"
    f.write_text(GOOD)
    p = presets.load(str(f))
    assert (p.name, p.backend, p.context_window, p.prefill_chunk) == ("mine", "opencl", 1024, 128)
    assert p.target.threads_per_block == 64


def load_text(tmp_path, text: str):
    f = tmp_path / "p.yaml"
    f.write_text(text)
    return presets.load(str(f))


def error(tmp_path, text: str) -> str:
    with pytest.raises(DeployError) as e:
        load_text(tmp_path, text)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_unknown_top_level_key_names_the_nearest(tmp_path):
    msg = error(tmp_path, GOOD.replace("context_window:", "context_windw:"))
    assert "unknown key 'context_windw'" in msg and "did you mean 'context_window'?" in msg


def test_unknown_target_key_names_the_nearest(tmp_path):
    msg = error(tmp_path, GOOD.replace("  threads_per_block:", "  thread_per_block:"))
    assert "target" in msg and "unknown key 'thread_per_block'" in msg and "'threads_per_block'" in msg


def test_unknown_runtime_key(tmp_path):
    msg = error(tmp_path, GOOD.replace("  backend: opencl", "  backnd: opencl"))
    assert "runtime" in msg and "unknown key 'backnd'" in msg and "'backend'" in msg


def test_unrelated_unknown_key_lists_the_valid_ones(tmp_path):
    msg = error(tmp_path, GOOD + "zzz: 1\n")
    assert "unknown key 'zzz'" in msg and "valid keys:" in msg and "prefill_chunk" in msg


@pytest.mark.parametrize("old,new,needles", [
    ("context_window: 1024", "context_window: big", ["'context_window' must be an integer", "'big'"]),
    ("context_window: 1024", "context_window: true", ["'context_window' must be an integer", "True"]),
    ("prefill_chunk: 128", "prefill_chunk: -1", ["'prefill_chunk' must be a positive integer", "-1"]),
    ("prefill_chunk: 128", "prefill_chunk: 0", ["'prefill_chunk' must be a positive integer"]),
    ("  threads_per_block: 64", "  threads_per_block: sixty", ["target: 'threads_per_block' must be an integer"]),
    ("  threads_per_block: 64", "  threads_per_block: 6.5", ["target: 'threads_per_block' must be an integer", "6.5"]),
    ("  threads_per_block: 64", "  threads_per_block: 64\n  fp16_arithmetic: yes please",
     ["target: 'fp16_arithmetic' must be true or false"]),
    ("  threads_per_block: 64", "  threads_per_block: 512", ["threads_per_block 512 exceeds max_threads_per_block 256"]),
    ("  kind: opencl", "  kind: metal", ["unknown target kind 'metal'"]),
    ("  backend: opencl", "  backend: vulkan", ["runtime backend 'vulkan' is not one of"]),
    ("quantization: q0f32", "quantization: 4", ["'quantization' must be a string"]),
    ("runtime:\n  backend: opencl", "runtime: opencl", ["'runtime' must be a mapping"]),
    ("quantization: q0f32", "quantization: q0f32\nkv_cache: int8", ["'kv_cache' is 'int8'", "float32, float16"]),
])
def test_bad_types_and_values(tmp_path, old, new, needles):
    assert old in GOOD
    msg = error(tmp_path, GOOD.replace(old, new))
    assert msg.startswith(str(tmp_path / "p.yaml")), msg
    for n in needles:
        assert n in msg, msg


def test_a_half_cache_needs_half_stores(tmp_path):
    text = GOOD.replace("kind: opencl", "kind: cpu\n  isa: native").replace("backend: opencl", "backend: cpu")
    msg = error(tmp_path, text + "kv_cache: float16\n")
    assert "'kv_cache: float16' needs a target whose kernels store half floats (cuda, opencl, webgpu), not cpu" in msg
    assert "use kv_cache: float32" in msg


def test_target_must_be_a_mapping(tmp_path):
    assert "'target' must be a mapping" in error(tmp_path, "name: x\ntarget: opencl\n")


@pytest.mark.parametrize("key", ["name", "target"])
def test_required_keys(tmp_path, key):
    text = "name: x\ntarget:\n  kind: opencl\n"
    text = "\n".join(line for line in text.splitlines() if not line.startswith(key) and
                     not (key == "target" and line.startswith("  ")))
    assert f"missing required key '{key}'" in error(tmp_path, text)


def test_bad_yaml_says_where(tmp_path):
    msg = error(tmp_path, "name: x\ntarget: {kind: opencl\n")
    assert "is not valid YAML at line" in msg


def test_yaml_that_is_not_a_mapping(tmp_path):
    assert "must be a YAML mapping" in error(tmp_path, "- a\n- b\n")


def test_missing_file_and_unknown_name():
    with pytest.raises(DeployError, match="preset file nowhere/x.yaml does not exist"):
        presets.load("nowhere/x.yaml")
    with pytest.raises(DeployError, match="unknown device preset 'cpu-openc'; did you mean 'cpu-opencl'\\?"):
        presets.load("cpu-openc")
    with pytest.raises(DeployError, match="available: adreno, "):
        presets.load("zzzzzz")


def test_overrides():
    p = presets.load("cpu-opencl")
    q = apply_overrides(p, ["prefill_chunk=64", "target.threads_per_block=32", "context_window=512"])
    assert q == replace(p, prefill_chunk=64, context_window=512, target=replace(p.target, threads_per_block=32))
    with pytest.raises(DeployError, match="unknown key 'chunk'"):
        apply_overrides(p, ["chunk=1"])
    with pytest.raises(DeployError, match="must look like key=value"):
        apply_overrides(p, ["prefill_chunk"])
    with pytest.raises(DeployError, match="target: unknown key 'nope'"):
        apply_overrides(p, ["target.nope=1"])
    # the KV cache's type, and a GPU preset's hardware figures kept through an override
    h100 = presets.load("h100")
    assert h100.kv_cache == "float16" and presets.load("rtx4090").kv_cache == "float16" and p.kv_cache == "float32"
    assert apply_overrides(h100, ["kv_cache=float32"]) == replace(h100, kv_cache="float32")
    assert apply_overrides(h100, ["prefill_chunk=64"]).hardware == h100.hardware
    assert apply_overrides(p, ["kv_cache=float16"]).kv_cache == "float16"  # OpenCL stores half too, and WebGPU
    assert presets.load("chrome-webgpu").kv_cache == "float16" and presets.load("cpu-webgpu").kv_cache == "float32"
    assert apply_overrides(presets.load("cpu-webgpu"), ["kv_cache=float16"]).kv_cache == "float16"
    with pytest.raises(DeployError, match="needs a target whose kernels store half floats"):
        apply_overrides(presets.load("cpu"), ["kv_cache=float16"])


def test_the_runtime_and_the_compiler_share_one_table_of_target_fields():
    """runtime/validate.py defines the target's integer fields and ranges, its ISAs, languages and quantization
    names once; the compiler imports them (targets/base.py, deploycc/package.py), so the two cannot disagree on what
    a package may say. Every integer field of Target is range-checked on both sides, and nothing else is."""
    from dataclasses import fields

    from deploycc.package import QUANTIZATIONS as compiled
    from deploycc.quantization import QUANTIZATION
    from deploycc.runtime import validate
    from deploycc.runtime.kinds import KINDS
    from deploycc.targets import base
    from deploycc.targets.backend import BACKENDS

    ints = {f.name for f in fields(base.Target) if f.type in ("int", int)}
    assert set(validate.TARGET_INTS) == ints
    assert base.ISAS is validate.ISAS and compiled is validate.QUANTIZATIONS
    assert set(KINDS) == set(base.MAX_THREADS) == set(BACKENDS)
    assert set(compiled) == set(QUANTIZATION) | {"gguf"}


@pytest.mark.parametrize("name, entry", [("fused_add", "fused_add"), ("exp", "exp_"), ("dcc_pool", "dcc_pool_"),
                                         ("3d.x", "_3d_x")])
def test_one_entry_name_for_renderer_and_validator(name, entry):
    """A kernel's function name: the renderers write it and the package validator expects it from the same
    function (a kernel named like a library function gets a suffix on both sides)."""
    from deploycc.runtime.validate import entry_name
    from deploycc.targets.cstyle import ident

    assert ident(name) == entry_name(name) == entry
