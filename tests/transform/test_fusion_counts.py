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
