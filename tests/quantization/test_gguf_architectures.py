"""GGUF import of the architectures llama.cpp writes as qwen2, qwen3, gemma2, gemma3, phi3 and smollm3.

Each test makes a tiny random model with transformers, writes it as llama.cpp's convert_hf_to_gguf.py
would (tensor names from gguf's own TensorNameMap, metadata through GGUFWriter's keys, Gemma's norms
stored as 1 + w, Phi-3's LongRoPE factors as rope_factors_short/long tensors, Q/K rows permuted for
SmolLM3 as for Llama and nowhere else), loads the .gguf with deploycc and compares the reference
session's logits with transformers' on the original model: prefill of 13 tokens (longer than the
sliding windows) and 4 greedy decode steps, max |diff| <= 1e-4. One is then compiled for the cpu
target, and an unknown architecture is refused.
"""
import json
import math
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import require_cc, require_module

import deploycc
from deploycc.errors import DeployError
from quantization.test_gguf import _permute, _vocab  # convert_hf_to_gguf's permute; the byte-level vocabulary

gguf = require_module("gguf")
tf = require_module("transformers")

TOL = 1e-4


def vocab():
    """The byte-level vocabulary of the GGUF tests (tokens, types, merges)."""
    return _vocab()


def common(n_vocab):
    return dict(vocab_size=n_vocab, hidden_size=32, intermediate_size=48, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6, pad_token_id=0,
                bos_token_id=1, eos_token_id=2)


def configs(n):
    c = common(n)
    longrope = {"type": "longrope", "short_factor": [1.0, 1.3], "long_factor": [2.0, 4.0]}
    return {
        "qwen2": tf.Qwen2Config(**c, num_hidden_layers=2, rope_theta=1e6, tie_word_embeddings=False),
        "qwen3": tf.Qwen3Config(**c, num_hidden_layers=2, head_dim=12, tie_word_embeddings=True),
        "gemma2": tf.Gemma2Config(**c, num_hidden_layers=3, head_dim=12, query_pre_attn_scalar=12, sliding_window=5,
                                  attn_logit_softcapping=2.0, final_logit_softcapping=3.0),
        "gemma3": tf.Gemma3TextConfig(**c, num_hidden_layers=7, head_dim=16, query_pre_attn_scalar=16, sliding_window=5,
                                      rope_parameters={
                                          "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                          "full_attention": {"rope_type": "linear", "factor": 8.0,
                                                             "rope_theta": 1000000.0}}),
        "phi3": tf.Phi3Config(**{**c, "max_position_embeddings": 256}, num_hidden_layers=2, partial_rotary_factor=0.5,
                              sliding_window=6, original_max_position_embeddings=64, rope_scaling=longrope),
        "smollm3": tf.SmolLM3Config(**c, num_hidden_layers=4, rope_theta=2000000.0, tie_word_embeddings=True),
    }


def write_gguf(model, arch: str, path):
    """`model` as convert_hf_to_gguf.py writes it (F32 tensors)."""
    cfg = model.config
    tokens, types, merges = vocab()
    layers = cfg.num_hidden_layers
    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, arch.upper()), layers)
    w = gguf.GGUFWriter(str(path), arch)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w.add_block_count(layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    params = cfg.rope_parameters
    theta = (params.get("full_attention") or params)["rope_theta"]
    w.add_rope_freq_base(theta)
    if arch not in ("phi3", "smollm3"):
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if arch.startswith("gemma"):
        w.add_sliding_window(cfg.sliding_window)
    if arch == "gemma2":
        w.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
        w.add_final_logit_softcapping(cfg.final_logit_softcapping)
    if arch == "gemma3":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(params["full_attention"]["factor"])
    extra = {}
    if arch == "phi3":
        orig, dims = cfg.original_max_position_embeddings, int(head_dim * cfg.partial_rotary_factor)
        w.add_rope_dimension_count(dims)
        w.add_rope_scaling_orig_ctx_len(orig)
        w.add_sliding_window(cfg.sliding_window)
        scale = cfg.max_position_embeddings / orig
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(orig)))
        rope = cfg.rope_parameters
        extra = {"rope_factors_long.weight": np.asarray(rope["long_factor"], np.float32),
                 "rope_factors_short.weight": np.asarray(rope["short_factor"], np.float32)}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    state = model.state_dict()
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    for hf_name, t in state.items():
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        assert name is not None, f"gguf's TensorNameMap has no name for {hf_name}"
        arr = t.detach().numpy().astype(np.float32)
        if arch == "smollm3" and name.endswith(("attn_q.weight", "attn_k.weight")):  # LlamaModel's permute
            heads = cfg.num_attention_heads if "attn_q" in name else cfg.num_key_value_heads
            arr = _permute(arr, heads)
        if arch.startswith("gemma") and hf_name.endswith("norm.weight"):
            arr = arr + np.float32(1.0)  # convert_hf_to_gguf: Gemma's norms stored as 1 + w
        w.add_tensor(name, arr)
    for name, arr in extra.items():
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def make(arch: str, tmp_path):
    torch.manual_seed(0)
    cfg = configs(len(vocab()[0]))[arch]
    cls = {"qwen2": tf.Qwen2ForCausalLM, "qwen3": tf.Qwen3ForCausalLM, "gemma2": tf.Gemma2ForCausalLM,
           "gemma3": tf.Gemma3ForCausalLM, "phi3": tf.Phi3ForCausalLM, "smollm3": tf.SmolLM3ForCausalLM}[arch]
    cfg._attn_implementation = "eager"
    model = cls(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return model, write_gguf(model, arch, tmp_path / f"{arch}.gguf")


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    monkeypatch.setenv("DEPLOYCC_HOME", str(tmp_path / "home"))


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "gemma2", "gemma3", "phi3", "smollm3"])
def test_gguf_logits_match_transformers(arch, tmp_path):
    model, path = make(arch, tmp_path)
    # Phi-3: the short LongRoPE factors, as transformers uses them for sequences within the original 64 positions
    loaded = deploycc.load_model(str(path), **({"context_window": 64} if arch == "phi3" else {}))
    assert loaded.architecture == {"gemma3": "Gemma3ForCausalLM"}.get(arch, type(model).__name__)
    session = deploycc.reference_session(loaded)
    ids = [int(t) for t in np.random.default_rng(1).integers(3, model.config.vocab_size, 13)]
    ours = [session.prefill(ids, all_logits=True)]
    tokens = list(ids)
    for _ in range(4):
        tokens.append(int(np.argmax(ours[-1][-1])))
        ours.append(session.decode(tokens[-1])[None])
    with torch.no_grad():
        want = model(torch.tensor([tokens])).logits[0].numpy()
    got = np.concatenate(ours)
    diff = np.abs(got - want[: len(got)]).max(axis=-1)
    assert diff.max() <= TOL, f"max |diff| per position: {np.round(diff, 7).tolist()}"


def test_gguf_gemma2_compiles_for_cpu(tmp_path):
    require_cc()
    _, path = make("gemma2", tmp_path)
    out = tmp_path / "pkg"
    r = subprocess.run([sys.executable, "-m", "deploycc", "compile", str(path), "--device", "cpu", "-o", str(out),
                        "--override", "context_window=64", "--override", "prefill_chunk=16"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run([sys.executable, "-m", "deploycc", "verify", str(out), "--steps", "4", "--json"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert json.loads(r.stdout)["passed"]


def test_unknown_gguf_architecture_names_the_supported(tmp_path):
    path = tmp_path / "x.gguf"
    w = gguf.GGUFWriter(str(path), "falcon")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(DeployError, match="GGUF architecture 'falcon' is not supported; supported: llama, qwen2, "
                                          "qwen3, gemma2, gemma3, phi3, smollm3"):
        deploycc.load_model(str(path))
