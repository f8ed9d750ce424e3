"""Each architecture beyond Llama/GPT-2 as a compiled package, checked by `deploycc verify --against
transformers`: the package (native C on the cpu target with 4-bit weights; OpenCL C on PoCL in float32)
runs prompts of 1, 7 and 11 tokens and greedy decode steps beside transformers on the same weights
(rounded by the package's scheme), so one test covers config reading, weight conversion, the graph,
fusion, scheduling, codegen and the runtime of each model.

Tolerances are verify's own (deploycc/verify.py): float packages within 1e-3 of transformers' logits;
cpu packages with 8-bit activations (integer dot products) within a relative RMS of 0.25 (these tiny
models measure about 1e-2). The sliding windows (5 and 6) are shorter than the longest prompt plus its
decode steps, so keys leave the window in both prefill and decode.
"""
import json
import subprocess
import sys

import pytest
from conftest import require_cc, require_device

from fixtures import make_tiny

ARCHITECTURES = ["mistral-gqa4-window", "llama32-gqa2-tied", "qwen25-gqa3", "qwen3-gqa2-headdim-window",
                 "gemma2-gqa2-softcap", "gemma3-gqa4-local-global", "phi3-longrope-partial-window",
                 "smollm3-nope-yarn"]
DEVICES = {"cpu": "q4f16_1", "cpu-opencl": "q0f32"}


def cli(*args):
    return subprocess.run([sys.executable, "-m", "deploycc", *map(str, args)], capture_output=True, text=True,
                          timeout=600)


@pytest.mark.parametrize("device", sorted(DEVICES))
@pytest.mark.parametrize("name", ARCHITECTURES)
def test_package_matches_transformers(name, device, tmp_path):
    if device == "cpu":
        require_cc()
    else:
        require_device("opencl")
    src = make_tiny(name)
    out = tmp_path / "pkg"
    r = cli("compile", src, "--device", device, "--quantization", DEVICES[device], "-o", out,
            "--override", "prefill_chunk=8", "--override", "context_window=64")
    assert r.returncode == 0, r.stderr[-3000:]
    r = cli("verify", out, "--source", src, "--against", "transformers", "--steps", "6", "--json")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    report = json.loads(r.stdout)
    assert report["passed"], report["failure"]
    assert report[report["metric"]] <= report["tolerance"]
    assert report["top1_agreement"] >= 0.9
