"""Each architecture beyond Llama/GPT-2 as a compiled package, checked by `deploycc verify --against
transformers`: the package (native C on the cpu target with 4-bit weights; OpenCL C on PoCL in float32)
runs prompts of 1, 7 and 11 tokens and greedy decode steps beside transformers on the same weights
(rounded by the package's scheme), so one test covers config reading, weight conversion, the graph,
fusion, scheduling, codegen and the runtime of each model.

Tolerances are verify's own (deploycc/verify.py): float packages within 1e-3 of transformers' logits;
cpu packages with 8/16-bit activations (integer dot products) against transformers rounding the same linear
inputs the same way, within twice its largest spread when those inputs move by 4 ulp + 1e-4 (90th percentile
of the per-position relative RMS; these tiny models measure below 1e-6). The sliding windows (5 and 6) are
shorter than the longest prompt plus its decode steps, so keys leave the window in both prefill and decode.
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


def test_gemma3_multimodal_checkpoint_as_text(tmp_path):
    """Gemma 3 4B and larger ship as Gemma3ForConditionalGeneration: the language model under language_model.,
    a vision tower beside it. deploycc loads the text part: reference logits within 1e-4 of transformers'
    (13-token prompt, window 5), and a cpu package that verify passes against transformers."""
    import numpy as np
    import torch
    import transformers as tf

    import deploycc

    require_cc()
    torch.manual_seed(0)
    text = dict(vocab_size=300, hidden_size=32, intermediate_size=40, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, head_dim=8, sliding_window=5, query_pre_attn_scalar=8,
                layer_types=["sliding_attention", "sliding_attention", "full_attention"])
    vision = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    cfg = tf.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4, image_token_index=299,
                          boi_token_index=297, eoi_token_index=298)
    model = tf.Gemma3ForConditionalGeneration(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and name.startswith("model.language_model"):
                p.add_(torch.randn_like(p) * 0.1)
    src = tmp_path / "gemma3-mm"
    model.save_pretrained(src)
    loaded = deploycc.load_model(str(src))
    assert loaded.architecture == "Gemma3ForConditionalGeneration"
    ids = [5, 9, 30, 44, 7, 8, 100, 3, 4, 60, 61, 62, 63]
    got = deploycc.reference_session(loaded).prefill(ids, all_logits=True)
    hf = tf.AutoModelForCausalLM.from_pretrained(src, attn_implementation="eager").eval()
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0].numpy()
    assert np.abs(got - want).max() <= 1e-4
    out = tmp_path / "pkg"
    r = cli("compile", src, "--device", "cpu", "-o", out, "--override", "prefill_chunk=8",
            "--override", "context_window=64")
    assert r.returncode == 0, r.stderr[-3000:]
    r = cli("verify", out, "--source", src, "--against", "transformers", "--steps", "6", "--json")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert json.loads(r.stdout)["passed"]
