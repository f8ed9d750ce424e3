"""A float16 KV cache (the CUDA presets' `kv_cache: float16`; `--override kv_cache=float32` keeps float32).

The keys and values are rounded to half (to nearest, ties to even: `__float2half`) where they are stored, by the
fused rope-and-append kernel and by kv_pair in the server's steps; every attention kernel reads them back as float.
The package says so (manifest kv_cache.dtype), its KV cache and page pool take half the bytes, and the reference
session rounds its cache alike: on the CUDA emulation the package's logits are within float32's summation order of
that reference, and much further from the float32 cache's (the negative control: the rounding is real and the
reference's is the same).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import require_cxx

import deploycc
from deploycc.package import compile_model
from deploycc.runtime.engine import Engine
from fixtures import make_tiny

MODEL = "llama-gqa3-llama3rope"


@pytest.fixture(scope="module")
def packages(tmp_path_factory):
    require_cxx()
    src = make_tiny(MODEL)
    out = {}
    for kv in ("float16", "float32"):
        path = tmp_path_factory.mktemp(kv) / "pkg"
        with pytest.MonkeyPatch.context() as m:
            m.setenv("DEPLOYCC_CUDA_EMULATE", "forward")
            out[kv] = compile_model(str(src), "h100", "q4f16_1", context_window=64, out=str(path),
                                    overrides=("prefill_chunk=16", "max_num_sequences=2", "kv_pool_tokens=128",
                                               f"kv_cache={kv}"))
    return src, out


def test_the_package_says_and_allocates_half(packages, monkeypatch):
    monkeypatch.setenv("DEPLOYCC_CUDA_EMULATE", "forward")
    _, pkgs = packages
    m = {kv: json.loads((p / "manifest.json").read_text()) for kv, p in pkgs.items()}
    assert m["float16"]["kv_cache"]["dtype"] == "float16" and m["float32"]["kv_cache"]["dtype"] == "float32"
    assert 2 * m["float16"]["memory"]["kv_cache_bytes"] == m["float32"]["memory"]["kv_cache_bytes"]
    half, full = Engine.load(pkgs["float16"]), Engine.load(pkgs["float32"])
    assert 2 * half.cache.nbytes == full.cache.nbytes
    pool = Engine.load(pkgs["float16"], paged=True).cache
    assert pool.dtype == "float16"
    source = (pkgs["float16"] / "kernels" / "kernels.cu").read_text()
    # the appends store half (rounded to nearest), the attention kernels read half
    assert "half* __restrict__ k_cache" in source and "__float2half(" in source
    assert "half* __restrict__ k_cache" not in (pkgs["float32"] / "kernels" / "kernels.cu").read_text()


def test_the_reference_rounds_its_cache_alike(packages, monkeypatch):
    """A prompt of 20 tokens (two prefill chunks: the second attends to the first's cached keys) and 4 greedy
    decodes: the package against the reference with a float16 cache and with a float32 one."""
    monkeypatch.setenv("DEPLOYCC_CUDA_EMULATE", "forward")
    src, pkgs = packages
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
    print(f"half cache on h100 (emulated): {diff['float16']:.2e} from the rounding reference, "
          f"{diff['float32']:.2e} from the float32 one (largest logit {scale:.2f})")
    assert diff["float16"] <= 5e-5 * scale < diff["float32"], diff


@pytest.mark.parametrize("fixture", [MODEL, "gemma2-gqa2-softcap", "gpt2-odd"])
def test_verify_against_transformers_rounds_its_keys_alike(fixture, tmp_path, monkeypatch):
    """`verify --against transformers` on a float16-cache package: transformers attends to its keys and values
    rounded to half (verify.half_cache: each model's own eager attention, with eager's masks), and its noise
    references move them first. Without that rounding (the negative control) the same package fails."""
    pytest.importorskip("transformers")
    from deploycc import verify as V

    require_cxx()
    monkeypatch.setenv("DEPLOYCC_CUDA_EMULATE", "forward")
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
