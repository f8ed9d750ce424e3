"""merge_matmuls (deploycc/transform/merge_matmuls.py): linears that read one input become one linear on
row-concatenated weights, sliced after; the concatenation is done on the model's tensors (module_params).

The merged module must compute what the unmerged one does: logits of the legalized module (merged) against
the exported one (not merged), both in the numpy reference interpreter, within 1e-5 (float32; only the
summation order of the one matmul can differ). Float, 4-bit (scales and minimums) and biased (Qwen2's QKV
bias) weights; and the fusion rule that keeps a computed prologue (silu(gate) * up) out of a matmul.
"""
from __future__ import annotations

import numpy as np
import pytest

import deploycc
from deploycc import presets
from deploycc.export import export
from deploycc.interp import Interpreter
from deploycc.op.attention import RefKVCache
from deploycc.pipeline import kernel_report, run
from deploycc.quantization import quantize
from deploycc.transform.merge_matmuls import ATTR, function_params, merge_params, merged_name
from fixtures import make_tiny


def logits(mod, model, ids):
    cfg = model.config
    cache = RefKVCache(cfg.num_hidden_layers, 64, cfg.num_key_value_heads, cfg.head_dim)
    dtypes = {n: p.dtype for n, p in model.build().named_parameters()}
    params = function_params(mod, ((n, np.asarray(a, dtypes[n])) for n, a in model.params()), "prefill_all")
    out = [Interpreter(mod).run("prefill_all", np.array([ids], np.int32), cache, *params)[0]]
    out.append(Interpreter(mod).run("decode", np.array([[ids[0]]], np.int32), cache, *params)[0])
    return out


@pytest.mark.parametrize("fixture,quant,groups", [
    ("llama-gqa1", None, 4),          # 2 layers x (QKV, gate-up), float32 weights
    ("llama-gqa1", "q4f16_2", 4),     # packed codes, scales and minimums each concatenated
    ("qwen2-gqa5-tied", "q4f16_1", None),  # QKV with bias: the biases concatenate too
])
def test_merged_module_computes_the_same(fixture, quant, groups):
    model = quantize(deploycc.load_model(str(make_tiny(fixture))), quant)
    exported = export(model, 64)
    merged = run(exported, None, "legalized")
    table = merged.attrs[ATTR]
    weights = [m for m in table if m.endswith(("weight", "q_weight"))]
    assert groups is None or len(weights) == groups
    assert any("q_proj_k_proj_v_proj" in m for m in table) and any("gate_proj_up_proj" in m for m in table)
    if fixture.startswith("qwen2"):
        assert any(m.endswith("q_proj_k_proj_v_proj.bias") for m in table)
    names = {p.name for p in merged["decode"].params}
    assert not names & {p for parts in table.values() for p in parts}  # the parts are gone
    ids = [3, 17, 5, 9, 1]
    for got, want in zip(logits(merged, model, ids), logits(exported, model, ids)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_merge_params_concatenates_rows_in_order():
    table = {"a.q_proj_k_proj.w": ["a.q_proj.w", "a.k_proj.w"]}
    named = [("x", np.zeros(2)), ("a.q_proj.w", np.ones((2, 3))), ("a.k_proj.w", np.full((1, 3), 2.0)), ("y", np.ones(1))]
    out = list(merge_params(table, named))
    assert [n for n, _ in out] == ["x", "a.q_proj_k_proj.w", "y"]
    np.testing.assert_array_equal(out[1][1], [[1, 1, 1], [1, 1, 1], [2, 2, 2]])
    with pytest.raises(KeyError, match="a.k_proj.w"):
        list(merge_params(table, named[:2]))
    assert merged_name(["m.l.0.q_proj.q_scale", "m.l.0.v_proj.q_scale"]) == "m.l.0.q_proj_v_proj.q_scale"


def test_fewer_launches_and_no_computed_prologue_in_a_matmul():
    for quant in (None, "q4f16_2"):
        model = quantize(deploycc.load_model(str(make_tiny("llama-gqa1"))), quant)
        r = kernel_report(export(model, 64), presets.load("cpu").target)
        # per layer, merged and fused: QKV, q and k rope, v slice, attention, o+add, 2 norms, gate-up, silu*mul,
        # down+add = 11 (13 before the merge: test_fusion_counts.py); plus embedding, rope table, norm, head
        assert r["decode_launches"] == 2 + 2 * 11 + 2
        names = [k["name"] for k in r["kernels"] if k["launches_per_decode"]]
        assert any("silu_multiply" in n and "linear" not in n for n in names)  # its own kernel, not a prologue
