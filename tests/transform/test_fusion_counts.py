"""Fusion must not regress: decode kernel launches per step, fused and unfused (the figures of
`deploycc inspect MODEL --device cpu-opencl --kernels`)."""
import pytest

import deploycc
from deploycc import presets
from deploycc.export import export
from deploycc.pipeline import kernel_report
from fixtures import make_tiny


def report(path):
    return kernel_report(export(deploycc.load_model(str(path))), presets.load("cpu-opencl").target)


def test_llama_decode_launches():
    r = report(make_tiny("llama-gqa1"))  # 2 layers
    assert r["decode_launches_unfused"] == 44  # embedding + rope table + 2 x 20 per layer + norm + head
    assert r["decode_launches"] <= 26  # 2 + 2 x 11 + 2: QKV and gate-up merged, reshape+rope, matmul+residual fused
    per_decode = sum(k["launches_per_decode"] for k in r["kernels"])
    assert per_decode == r["decode_launches"]


@pytest.mark.model
def test_smollm2_decode_launches(smollm2_path):
    r = report(smollm2_path)  # 30 layers
    assert r["decode_launches_unfused"] == 604
    assert r["decode_launches"] <= 334


@pytest.mark.parametrize("model", ["llama-gqa1", "gemma2-gqa2-softcap"])
def test_gpu_decode_gemvs_read_the_gated_product(model):
    """GPU presets (transform/inline_prologue.py): the down projection of decode reads silu(gate) * up (GELU's for
    Gemma 2) where it loads its input, one launch a layer fewer, and the RMS norms before the q/k/v, the gate-up and
    the head projections are folded into those GEMVs (their sums of squares beside the rows': schedule/gemv.py), two
    launches a layer and one more fewer (Gemma 2's norms before a residual add stay); prefill keeps its programs (the
    tiles would recompute them per tile), and the cpu presets' module is the one they had. The graph interpreter runs
    both modules' decode steps to the same logits (1e-6 of the largest: the same float operations in one program
    instead of two, the norm's factor of each input taken once a row instead)."""
    import numpy as np

    from deploycc.interp import Interpreter
    from deploycc.op.attention import RefKVCache
    from deploycc.pipeline import launches
    from deploycc.pipeline import run as run_pipeline
    from deploycc.transform.merge_matmuls import function_params

    loaded = deploycc.load_model(str(make_tiny(model)))
    exported = export(loaded, 32)
    gpu = run_pipeline(exported, presets.load("h100").target, "fused")
    cpu = run_pipeline(exported, presets.load("cpu-opencl").target, "fused")
    layers = loaded.config.num_hidden_layers
    names = [p for p, _ in launches(gpu, "decode")]
    folded = [p for p in names if "rms_norm" in p and "linear" in p]
    assert len(folded) == 2 * layers + 1, names
    assert len(names) == len(launches(cpu, "decode")) - layers - len(folded)
    assert len(launches(gpu, "prefill")) == len(launches(cpu, "prefill"))
    gated = [p for p in names if "silu" in p or "gelu" in p]
    assert len(gated) == layers and all("linear" in p for p in gated), names
    assert str(run_pipeline(exported, presets.load("cpu").target, "fused")) == str(cpu)
    cfg = loaded.config
    params = [np.ascontiguousarray(a, np.float32) for a in function_params(gpu, loaded.params())]
    logits = []
    for mod in (gpu, cpu):
        interp, cache = Interpreter(mod), RefKVCache(layers, 32, cfg.num_key_value_heads, cfg.head_dim)
        interp.run("prefill", np.array([[3, 1, 4, 1, 5]], np.int32), cache, *params)
        logits.append(interp.run("decode", np.array([[9]], np.int32), cache, *params)[0, -1])
    assert np.abs(logits[0] - logits[1]).max() <= 1e-6 * np.abs(logits[1]).max()


def test_each_fold_can_be_switched_off(monkeypatch):
    """benchmarks/gpu_fold.py's variants: with FOLD_GATED off the down projection reads its input from the gated
    product's own kernel (one launch a layer more), with FOLD_NORMS off too the GPU preset's decode launches are the
    cpu presets' (inline_prologue.py folds nothing else)."""
    from deploycc.pipeline import launches
    from deploycc.pipeline import run as run_pipeline
    from deploycc.transform import inline_prologue

    loaded = deploycc.load_model(str(make_tiny("llama-gqa1")))
    exported = export(loaded, 32)
    layers = loaded.config.num_hidden_layers
    cpu = len(launches(run_pipeline(exported, presets.load("cpu-opencl").target, "fused"), "decode"))
    counts = []
    for off in ((), ("FOLD_GATED",), ("FOLD_GATED", "FOLD_NORMS")):
        for flag in ("FOLD_GATED", "FOLD_NORMS"):
            monkeypatch.setattr(inline_prologue, flag, flag not in off)
        counts.append(len(launches(run_pipeline(exported, presets.load("h100").target, "fused"), "decode")))
    assert counts == [cpu - layers - (2 * layers + 1), cpu - (2 * layers + 1), cpu]
