"""A float16 KV cache (`kv_cache: float16`: the h100, rtx4090, adreno and chrome-webgpu presets'; `--override
kv_cache=...` sets it on any CUDA, OpenCL or WebGPU preset).

The keys and values are rounded to half (to nearest, ties to even: CUDA's `__float2half`, OpenCL's `vstore_half`,
WGSL's `f16()` or `pack2x16float`) where they are stored, by the fused rope-and-append kernel and by kv_pair in the
server's steps; every attention kernel reads them back as float. The package says so (manifest kv_cache.dtype), its
KV cache and page pool take half the bytes, and the reference session rounds its cache alike: the package's logits
are within float32's summation order of that reference, and much further from the float32 cache's (the negative
control: the rounding is real and the reference's is the same). Here on the CUDA emulation (h100), on PoCL
(cpu-opencl with the override) and on lavapipe (cpu-webgpu with the override), WebGPU twice: with shader-f16
(`array<f16>`) and without it (`cpu-webgpu-nof16`: the kernels that adapters without it run, two halves a u32 word,
each written with an atomicAnd and an atomicOr, targets/wgsl.py).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import require_cxx, require_device

import deploycc
from deploycc.package import compile_model
from deploycc.runtime.engine import Engine
from fixtures import make_tiny

MODEL = "llama-gqa3-llama3rope"
SOURCES = {"h100": "kernels.cu", "cpu-opencl": "kernels.cl", "cpu-webgpu": "*.wgsl", "cpu-webgpu-nof16": "*.nof16.wgsl"}
# how each target stores and declares a half cache
HALF = {"h100": ("half* __restrict__ k_cache", "__float2half("),  # the fused append
        "cpu-opencl": ("__global const half* restrict k,", "vstore_half("),  # kv_copy; the attention's keys
        "cpu-webgpu": ("var<storage, read_write> k_cache: array<f16>;", "] = f16("),
        "cpu-webgpu-nof16": ("var<storage, read_write> k_cache: array<atomic<u32>>;", "st_k_cache(")}


def needs(preset: str, monkeypatch) -> None:
    if preset == "h100":
        require_cxx()
        monkeypatch.setenv("DEPLOYCC_CUDA_EMULATE", "forward")
    elif preset == "cpu-opencl":
        require_device("opencl")
    else:  # lavapipe has shader-f16: without it, as on SwiftShader, through the environment
        require_device("webgpu")
        monkeypatch.setenv("DEPLOYCC_WEBGPU_F16", "0" if preset.endswith("-nof16") else "1")


def source(pkg, preset: str) -> str:
    pattern = SOURCES[preset]
    return "".join(f.read_text() for f in sorted((pkg / "kernels").glob(pattern))
                   if preset != "cpu-webgpu" or not f.name.endswith(".nof16.wgsl"))


@pytest.fixture(scope="module", params=sorted(SOURCES))
def packages(request, tmp_path_factory):
    preset = request.param
    src = make_tiny(MODEL)
    out = {}
    with pytest.MonkeyPatch.context() as m:
        needs(preset, m)
        for kv in ("float16", "float32"):
            path = tmp_path_factory.mktemp(f"{preset}-{kv}") / "pkg"
            out[kv] = compile_model(str(src), preset.removesuffix("-nof16"), "q4f16_1", context_window=64, out=str(path),
                                    overrides=("prefill_chunk=16", "max_num_sequences=2", "kv_pool_tokens=128",
                                               f"kv_cache={kv}"))
    return preset, src, out


def test_the_package_says_and_allocates_half(packages, monkeypatch):
    preset, _, pkgs = packages
    needs(preset, monkeypatch)
    m = {kv: json.loads((p / "manifest.json").read_text()) for kv, p in pkgs.items()}
    assert m["float16"]["kv_cache"]["dtype"] == "float16" and m["float32"]["kv_cache"]["dtype"] == "float32"
    assert 2 * m["float16"]["memory"]["kv_cache_bytes"] == m["float32"]["memory"]["kv_cache_bytes"]
    half, full = Engine.load(pkgs["float16"]), Engine.load(pkgs["float32"])
    assert 2 * half.cache.nbytes == full.cache.nbytes
    assert Engine.load(pkgs["float16"], paged=True).cache.dtype == "float16"
    declared, stored = HALF[preset]
    text = source(pkgs["float16"], preset)
    assert declared in text and stored in text  # the appends store half, the attention kernels read it
    assert declared not in source(pkgs["float32"], preset)


def test_the_reference_rounds_its_cache_alike(packages, monkeypatch):
    """A prompt of 20 tokens (two prefill chunks: the second attends to the first's cached keys) and 4 greedy
    decodes: the package against the reference with a float16 cache and with a float32 one."""
    preset, src, pkgs = packages
    needs(preset, monkeypatch)
    engine = Engine.load(pkgs["float16"])
    model = deploycc.load_model(str(src))
    refs = {kv: deploycc.reference_session(model, context_window=64, quantization="q4f16_1", kv_cache=kv)
            for kv in ("float16", "float32")}
    ids = [int(t) for t in np.random.default_rng(3).integers(0, engine.vocab_size, 20)]
    got = [engine.prefill(ids)]
    want = {kv: [r.prefill(ids)] for kv, r in refs.items()}
    for _ in range(4):
        token = int(np.argmax(want["float16"][-1]))
        got.append(engine.decode(token))
        for kv, r in refs.items():
            want[kv].append(r.decode(token))
    diff = {kv: max(float(np.abs(g - w).max()) for g, w in zip(got, ws)) for kv, ws in want.items()}
    scale = max(float(np.abs(w).max()) for w in want["float16"])
    print(f"half cache on {preset}: {diff['float16']:.2e} from the rounding reference, "
          f"{diff['float32']:.2e} from the float32 one (largest logit {scale:.2f})")
    assert diff["float16"] <= 5e-5 * scale < diff["float32"], diff


@pytest.mark.parametrize("fixture", [MODEL, "gemma2-gqa2-softcap", "gpt2-odd"])
def test_verify_against_transformers_rounds_its_keys_alike(fixture, tmp_path, monkeypatch):
    """`verify --against transformers` on a float16-cache package: transformers attends to its keys and values
    rounded to half (verify.half_cache: each model's own eager attention, with eager's masks), and its noise
    references move them first. Without that rounding (the negative control) the same package fails."""
    pytest.importorskip("transformers")
    from deploycc import verify as V

    needs("h100", monkeypatch)
    src = make_tiny(fixture)
    pkg = compile_model(str(src), "h100", "q0f32", context_window=48, out=str(tmp_path / "pkg"),
                        overrides=("prefill_chunk=16",))
    report = V.verify_package(pkg, source=str(src), against=V.Against.TRANSFORMERS, steps=2)
    assert report.passed and "a float16 KV cache" in report.reference, report.failure
    monkeypatch.setattr(V, "half_cache", lambda model, jitter=None: None)
    unrounded = V.verify_package(pkg, source=str(src), against=V.Against.TRANSFORMERS, steps=2)
    print(f"{fixture}: {report.measured:.2e} against transformers on half keys (bound {report.criterion.limit:.2e}), "
          f"{unrounded.measured:.2e} on float32 keys")
    assert not unrounded.passed


def test_the_server_steps_over_a_half_pool(packages, monkeypatch):
    """Two sequences in the batched steps over the float16 page pool (kv_pair's half stores, the paged attention's
    half reads), against the single-sequence engine on the same package: within 1e-3 (a key the two engines' float32
    sums put on either side of a tie between two halves rounds apart: test_batch.py)."""
    from deploycc.runtime.batch import Batcher

    from .test_batch import concurrently, prompts

    preset, _, pkgs = packages
    needs(preset, monkeypatch)
    engine = Engine.load(pkgs["float16"], paged=True)
    work = prompts(engine.vocab_size, (9, 19))
    together = concurrently(Batcher(engine), work, 4, overlap=True)
    single = Engine.load(pkgs["float16"])
    for ids, got in zip(work, together):
        single.reset()
        want = [single.prefill(ids)] + [single.decode(int(np.argmax(x))) for x in got[:-1]]
        assert max(float(np.abs(x - y).max()) for x, y in zip(want, got)) < 1e-3
    assert engine.cache.pages_in_use == 0
