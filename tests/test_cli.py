"""The CLI: inspect prints the IR; run streams text; bad input is one line on stderr and exit 1."""
import subprocess
import sys

import pytest

from fixtures import make_tiny


def cli(*args):
    return subprocess.run([sys.executable, "-m", "deploycc", *args], capture_output=True, text=True, timeout=300)


def assert_one_line_error(r, *fragments):
    assert r.returncode == 1, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert "Traceback" not in r.stderr
    for f in fragments:
        assert f in lines[0]


def test_inspect_stages():
    path = str(make_tiny("llama-gqa1"))
    exported = cli("inspect", path, "--stage", "exported")
    legalized = cli("inspect", path, "--stage", "legalized")
    assert exported.returncode == 0 and legalized.returncode == 0
    assert "kv.begin(cache, shape([seq_len]))" in exported.stdout
    assert "= attention(rope_apply, k_all, v_all, scale=" in exported.stdout
    assert "= rope_table(const(" in exported.stdout  # once per step, shared by every layer
    assert "call_tir(attention, [rope_apply, k_all, v_all]" in legalized.stdout
    assert "@tensor_program" in legalized.stdout and "@tensor_program" not in exported.stdout


def test_inspect_rejects_unknown_stage():
    r = cli("inspect", str(make_tiny("llama-gqa1")), "--stage", "fused-ish")
    assert r.returncode == 2 and "Invalid value for '--stage'" in r.stderr


def test_run_without_tokenizer_is_one_line():
    assert_one_line_error(cli("run", str(make_tiny("llama-gqa1")), "--prompt", "hi"), "tokenizer.json")


@pytest.mark.model
def test_run_prompt_longer_than_context(smollm2_path):
    r = cli("run", smollm2_path, "--prompt", "word " * 200, "--context-window", "64")
    assert_one_line_error(r, "context window")


@pytest.mark.model
def test_run_json(smollm2_path):
    import json

    r = cli("run", smollm2_path, "--prompt", "What is the capital of France?", "--max-tokens", "12", "--temperature", "0",
            "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert "Paris" in out["text"] and len(out["generated"]) <= 12


def test_inspect_as_python_runs(tmp_path):
    """`inspect --as-python` prints code that runs on torch and gives the reference logits (1e-4)."""
    import numpy as np
    import torch

    import deploycc
    from deploycc.export import export
    from deploycc.pymodule import TorchKVCache, torch_weights
    from deploycc.topython import load_python

    path = make_tiny("llama-gqa1")
    r = cli("inspect", str(path), "--stage", "fused", "--as-python", "--function", "prefill")
    assert r.returncode == 0, r.stderr
    model = deploycc.load_model(str(path))
    from deploycc.pipeline import run

    mod = run(export(model), None, "fused")
    py = load_python(r.stdout, mod, "host")
    ids = [5, 7, 11]
    got = py.prefill(torch.tensor([ids], dtype=torch.int32), TorchKVCache.for_model(model), *torch_weights(model, mod))
    want = deploycc.reference_session(model).prefill(ids)
    assert np.abs(got[0, -1].numpy() - want).max() <= 1e-4
    bad = cli("inspect", str(path), "--as-python", "--kernels", "--device", "cpu-opencl")
    assert_one_line_error(bad, "--as-python")
