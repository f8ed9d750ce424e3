"""Sliding-window layers keep a ring of window + prefill_chunk - 1 rows instead of the whole context
window (nn.Cache.rows): the graph, the reference interpreter, the printed torch module and the packages
all read position j from row j % rows.

- Graph level: a module exported with rings (step = 4) runs in chunks of at most 4 tokens through the
  reference interpreter and as printed torch code, and gives the logits of the module without rings
  (interpreter: max |diff| <= 1e-5, the same arithmetic on the same values, measured 0; torch: 1e-5 of the
  largest logit, its float32 rounding against numpy's, measured 3.6e-6 of it) for a 30-token prompt (the rings
  wrap several times) and 6 decode steps.
- Packages (cpu-webgpu here: tests/models/test_architectures.py runs cpu and cpu-opencl): the manifest's
  kv_cache.rows, the smaller KV cache, and `verify --against transformers` across wraps; the engine refuses
  a step longer than the rings allow and a truncation whose positions the rings overwrote, and the prefix
  cache then prefills afresh, giving the greedy tokens of a fresh engine.
"""
import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import require_device

import deploycc
from deploycc.export import export
from deploycc.interp import Interpreter
from deploycc.op.attention import RefKVCache
from deploycc.pymodule import TorchKVCache, torch_weights
from deploycc.topython import load_python, module_to_python
from deploycc.transform.merge_matmuls import function_params
from fixtures import make_tiny

STEP, CONTEXT = 4, 48
WINDOWED = ["mistral-gqa4-window", "gemma3-gqa4-local-global", "qwen3-gqa2-headdim-window"]


def rows_of(mod) -> dict[int, int]:
    out = {}
    for fn in ("prefill", "decode"):
        for block in mod[fn].body.blocks:
            for b in block.bindings:
                v = b.value
                if getattr(v, "op", None) == "kv.append" and v.attrs.get("rows"):
                    out[v.attrs["layer"]] = v.attrs["rows"]
    return out


def run_chunked(run, ids, steps):
    """prefill_all in chunks of STEP, then greedy decode steps: every position's logits."""
    out = [run("prefill_all", ids[i:i + STEP]) for i in range(0, len(ids), STEP)]
    token = int(np.argmax(out[-1][-1]))
    for _ in range(steps):
        out.append(run("decode", [token]))
        token = int(np.argmax(out[-1][-1]))
    return np.concatenate(out)


@pytest.mark.parametrize("name", WINDOWED)
def test_rings_equal_full_caches_in_the_graph_and_as_python(name):
    model = deploycc.load_model(str(make_tiny(name)))
    cfg = model.config
    ringed, full = export(model, CONTEXT, STEP), export(model, CONTEXT)
    rows = rows_of(ringed)
    windows = {i: cfg.window(i) for i in range(cfg.num_hidden_layers)}
    assert rows == {i: w + STEP - 1 for i, w in windows.items() if w} and rows and not rows_of(full)
    params = [a for _, a in model.params()]
    ids = [int(t) for t in np.random.default_rng(0).integers(0, cfg.vocab_size, 30)]

    def interp(mod):
        cache = RefKVCache(cfg.num_hidden_layers, CONTEXT, cfg.num_key_value_heads, cfg.head_dim)
        it = Interpreter(mod)
        ps = function_params(mod, model.params(), "prefill")
        return lambda fn, x: it.run(fn, np.array([x], np.int32), cache, *ps)[0]

    want = run_chunked(interp(full), ids, 6)
    got = run_chunked(interp(ringed), ids, 6)
    assert np.abs(got - want).max() <= 1e-5
    py = load_python(module_to_python(ringed), ringed, "host")
    cache = TorchKVCache.for_model(model, CONTEXT)
    weights = torch_weights(model)
    printed = run_chunked(lambda fn, x: getattr(py, fn)(torch.tensor([x], dtype=torch.int32), cache, *weights)[0].numpy(),
                          ids, 6)
    assert np.abs(printed - want).max() <= 1e-5 * max(1.0, np.abs(want).max())
    assert len(params) == len(weights)


def cli(*args):
    return subprocess.run([sys.executable, "-m", "deploycc", *map(str, args)], capture_output=True, text=True,
                          timeout=600)


@pytest.fixture(scope="module")
def webgpu_package(tmp_path_factory):
    require_device("webgpu")
    out = tmp_path_factory.mktemp("ring") / "pkg"
    src = make_tiny("gemma3-gqa4-local-global")
    r = cli("compile", src, "--device", "cpu-webgpu", "--quantization", "q0f32", "-o", out,
            "--override", f"prefill_chunk={STEP}", "--override", f"context_window={CONTEXT}")
    assert r.returncode == 0, r.stderr[-3000:]
    return src, out


def test_package_keeps_rings_and_matches_transformers(webgpu_package):
    src, pkg = webgpu_package
    m = json.loads((pkg / "manifest.json").read_text())
    assert m["kv_cache"]["rows"] == [6 + STEP - 1, 6 + STEP - 1, 0]  # two local layers of window 6, one global
    per_row = 2 * m["kv_cache"]["kv_heads"] * m["kv_cache"]["head_dim"] * 4
    assert m["memory"]["kv_cache_bytes"] == per_row * (9 + 9 + CONTEXT)
    r = cli("verify", pkg, "--source", src, "--against", "transformers", "--steps", "12", "--json")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    report = json.loads(r.stdout)
    assert report["passed"] and report["max_abs_diff"] <= 1e-3


def test_engine_guards_the_rings(webgpu_package):
    from deploycc.runtime.engine import Engine
    from deploycc.runtime.generate import PrefixCache
    from deploycc.runtime.kvcache import ContextWindowFull

    _, pkg = webgpu_package
    eng = Engine.load(pkg)
    ids = [int(t) for t in np.random.default_rng(3).integers(0, eng.vocab_size, 20)]
    prefix = PrefixCache.of(eng)
    assert prefix.start(eng, ids) == 0
    eng.prefill(ids)  # the engine prefills in chunks of STEP
    prefix.ids = list(ids)  # as generate records what the cache holds
    with pytest.raises(ContextWindowFull, match="exceeds the 4 the sliding-window rings"):
        eng.cache.begin(STEP + 1)
    assert eng.cache.keeps(20 - STEP) and not eng.cache.keeps(20 - STEP - 1)
    with pytest.raises(ValueError, match="sliding-window rings moved past them"):
        eng.truncate(2)
    # A prompt sharing only its first 10 tokens with the cache: the rings lost them, so it prefills afresh
    other = ids[:10] + [(t + 1) % eng.vocab_size for t in ids[10:]]
    assert prefix.start(eng, ids[:18] + [0, 0]) == 18 and eng.cache.length == 18  # within reach: kept
    eng.prefill(ids[18:])
    prefix.ids = list(ids)
    assert prefix.start(eng, other) == 0 and eng.cache.length == 0  # 10 shared, but the rings moved past them
    got = eng.prefill(other)
    fresh = Engine.load(pkg)
    np.testing.assert_allclose(got, fresh.prefill(other), rtol=0, atol=1e-5)
    # Within the rings' reach, truncation keeps the cache and equals a fresh prefill
    eng.truncate(len(other) - 2)
    np.testing.assert_allclose(eng.prefill(other[-2:]), got, rtol=0, atol=1e-4)


def test_inspect_memory_counts_the_rings(webgpu_package):
    """`deploycc inspect --memory` reports the KV cache the package holds, rings included."""
    src, pkg = webgpu_package
    r = cli("inspect", src, "--device", "cpu-webgpu", "--memory", "--json", "--override", f"prefill_chunk={STEP}",
            "--context-window", CONTEXT)
    assert r.returncode == 0, r.stderr[-2000:]
    m = json.loads((pkg / "manifest.json").read_text())
    assert json.loads(r.stdout)["kv_cache_bytes"] == m["memory"]["kv_cache_bytes"]
