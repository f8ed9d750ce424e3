"""`deploycc verify` passes correct 4-bit packages and fails a package compiled from other weights, against
both references: the numpy reference of the package's own quantization, and transformers in float32 with
the source weights rounded as the package's scheme rounds them. Both hold the package's weights exactly,
so the tolerance is float32 rounding (1e-3) for every scheme.

The wrong package is compiled from a copy of the tiny llama whose lm_head holds other random values of the
same spread, and verified with --source naming the original. Measured on these fixtures (cpu-opencl):
correct q4 packages <= 2e-7 against either reference (0.06-0.07 from the unrounded float model); the
wrong package 0.6 against either.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import require_device
from test_package_cli import assert_one_line_error, cli

from fixtures import make_tiny

MODEL = "llama-gqa1"


@pytest.fixture(scope="module")
def original() -> Path:
    return make_tiny(MODEL)


@pytest.fixture(scope="module")
def other_weights(original, tmp_path_factory) -> Path:
    """The tiny llama with lm_head.weight drawn anew (same shape and spread): another model of the same shape."""
    from safetensors.numpy import load_file, save_file

    dst = tmp_path_factory.mktemp("other") / MODEL
    shutil.copytree(original, dst)
    (f,) = dst.glob("*.safetensors")
    tensors = load_file(f)
    w = tensors["lm_head.weight"]
    tensors["lm_head.weight"] = (np.random.default_rng(7).standard_normal(w.shape) * w.std()).astype(w.dtype)
    save_file(tensors, f, metadata={"format": "pt"})
    return dst


@pytest.fixture(scope="module")
def packages(original, other_weights, tmp_path_factory):
    """name -> package dir: the correct q4f16_1 and q4f16_2 packages and `wrong` (q4f16_1 of other_weights)."""
    from deploycc.package import compile_model

    require_device("opencl")
    root = tmp_path_factory.mktemp("verify-pkgs")
    made = {q: compile_model(str(original), "cpu-opencl", quantization=q, out=str(root / q)) for q in ("q4f16_1", "q4f16_2")}
    made["wrong"] = compile_model(str(other_weights), "cpu-opencl", quantization="q4f16_1", out=str(root / "wrong"))
    return made


@pytest.mark.parametrize("against", ["numpy", "transformers"])
@pytest.mark.parametrize("scheme", ["q4f16_1", "q4f16_2"])
def test_correct_4bit_package_passes(packages, scheme, against):
    r = cli("verify", packages[scheme], "--against", against, "--steps", "2", "--json")
    assert r.returncode == 0, r.stderr
    v = json.loads(r.stdout)
    assert v["passed"] and v["failure"] is None and v["quantization"] == scheme
    assert v["max_abs_diff"] <= v["tolerance"] == 1e-3 and v["top1_agreement"] == 1.0
    if against == "numpy":
        assert v["reference"] == f"the numpy reference of {scheme}" and "float_model" not in v
    else:
        assert v["reference"] == f"transformers (float32) on the weights rounded to {scheme}"
        assert v["float_model"]["max_abs_diff"] > 1e-2, "4-bit weights are not the float model's"
    assert [(s["prompt_len"], s["step"]) for s in v["steps"]] == [(n, s) for n in (1, 7, 33) for s in ("prefill", 1, 2)]


def test_table_names_the_reference(packages):
    r = cli("verify", packages["q4f16_1"], "--steps", "1")
    assert r.returncode == 0, r.stderr
    assert "against the numpy reference of q4f16_1" in r.stdout.replace("\n", " ")
    assert "ok: against the numpy reference of q4f16_1: " in r.stdout
    assert "within largest |logit difference| <= 0.001" in r.stdout
    r = cli("verify", packages["q4f16_1"], "--steps", "1", "--against", "transformers")
    assert r.returncode == 0, r.stderr
    assert "the unrounded float model: largest difference" in r.stdout


@pytest.mark.parametrize("against,reference", [("numpy", "the numpy reference of q4f16_1"),
                                               ("transformers", "transformers (float32) on the weights rounded to q4f16_1")])
def test_package_from_other_weights_fails(packages, original, against, reference):
    r = cli("verify", packages["wrong"], "--source", original, "--against", against, "--steps", "2", "--json")
    assert_one_line_error(r, "largest logit difference", f"against {reference} exceeds the tolerance 0.001",
                          "was the package compiled from this model (--source)?")
    v = json.loads(r.stdout)
    assert v["passed"] is False and v["max_abs_diff"] > 0.1 and v["top1_agreement"] < 0.2


@pytest.mark.parametrize("name", ["llama-gqa1", "gpt2-odd", "qwen2-gqa5-tied", "qwen3-x32"])
def test_rounded_transformers_equals_the_quantized_reference(name):
    """transformers on the scheme-rounded weights (GPT-2's Conv1D transposed, tied heads) computes what the
    numpy reference of the quantized model computes: the rounding is the package's, weight for weight. And with
    the activations rounded as the cpu target's integer kernels round them (forward pre-hooks on transformers'
    linears, tied heads included; qwen3-x32: every linear), what the numpy reference computes with its
    round_activations: the 90th percentile of the positions' relative RMS difference within 1e-5 (a rounding
    that float32 summation order flips may move a position; none did here)."""
    import deploycc
    from deploycc.export import export
    from deploycc.quantization import quantize
    from deploycc.session import reference_session
    from deploycc.transform.absorb_rounding import rounded_linears
    from deploycc.verify import QUANTILE, compare_logits, summary, transformers_references

    loaded = deploycc.load_model(str(make_tiny(name)))
    rounded, noise, plain = transformers_references(str(loaded.path), loaded, "q4f16_2", "q8f16_0", {})
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    want = reference_session(loaded, quantization="q4f16_2", head_quantization="q8f16_0").prefill(ids, all_logits=True)
    assert noise is None
    assert np.abs(rounded.prefill(ids, all_logits=True) - want).max() <= 1e-4
    assert np.abs(plain.prefill(ids, all_logits=True) - want).max() > 1e-3
    record = rounded_linears(export(quantize(loaded, "q4f16_2", "q8f16_0", activations=8), 64))
    assert bool(record) == (name != "gpt2-odd")  # GPT-2's 36 inputs are not whole blocks of 32
    rounded, noise, _ = transformers_references(str(loaded.path), loaded, "q4f16_2", "q8f16_0", record)
    assert noise is None or len(noise) == 3
    want8 = reference_session(loaded, quantization="q4f16_2", head_quantization="q8f16_0",
                              activations=record).prefill(ids, all_logits=True)
    got8 = rounded.prefill(ids, all_logits=True)
    assert summary([compare_logits(8, "prefill", got8, want8)])[QUANTILE] <= 1e-5
    if record:  # the rounding is there: it moves the logits far more than float32 rounding
        assert np.abs(want8 - want).max() > 1e-3


def test_against_transformers_without_transformers(packages):
    """torch / transformers not importable: one line saying what to install (simulated by blocking the import)."""
    code = ("import sys; sys.modules['transformers'] = None; from deploycc.cli import main; "
            f"sys.argv = ['deploycc', 'verify', {str(packages['q4f16_1'])!r}, '--against', 'transformers']; main()")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert_one_line_error(r, "--against transformers needs torch and transformers", "pip install torch transformers")


def test_gguf_kept_as_stored_against_transformers(tmp_path):
    """A .gguf compiled with its blocks kept: transformers dequantizes the same blocks (gguf_file=), so the
    package agrees with it to float32 rounding."""
    from quantization.test_gguf import MIXED, write_tiny

    from deploycc.package import compile_model

    require_device("opencl")
    path, _ = write_tiny(tmp_path, MIXED)
    kept = compile_model(str(path), "cpu-opencl", out=str(tmp_path / "kept"))
    r = cli("verify", kept, "--against", "transformers", "--steps", "1", "--json")
    assert r.returncode == 0, r.stderr
    v = json.loads(r.stdout)
    assert v["quantization"] == "gguf" and v["reference"] == "transformers (float32)" and v["max_abs_diff"] <= 1e-3


def test_prompts_go_past_the_sliding_window(tmp_path):
    """A model with sliding windows is verified on a prompt longer than its longest ring (window + prefill chunk
    rows), so the ring wraps and the window masks cut; on the other prompts of 1, 7 and chunk + 3 tokens they
    need not."""
    from deploycc.package import compile_model
    from deploycc.verify import verify_package

    require_device("opencl")
    pkg = compile_model(str(make_tiny("mistral-gqa4-window")), "cpu-opencl", quantization="q4f16_1",
                        out=str(tmp_path / "pkg"), overrides=("prefill_chunk=16", "context_window=64"))
    ring = max(json.loads((pkg / "manifest.json").read_text())["kv_cache"]["rows"])
    assert ring >= 5
    report = verify_package(pkg, steps=2)
    lengths = {s.prompt_len for s in report.steps}
    assert max(lengths) == ring + 3 and report.passed, (lengths, ring)
