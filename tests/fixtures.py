"""Tiny random-weight Hugging Face checkpoints of every supported architecture, made with
transformers into a cache outside the repo ($DEPLOYCC_HOME/test-fixtures, default ~/.cache/deploycc).

The shapes are chosen to catch indexing mistakes: GQA ratios 1, 2, 3 and 4 (and 5), hidden sizes that
differ from heads * head_dim (explicit head_dim), odd vocabularies, tied and untied heads,
rope scaling (linear, Llama 3, YaRN, LongRoPE), partial rotary, sliding windows shorter than the
prompts, QK-norm, soft-capping, 2-4 layers.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

TINY = {
    # name: (architecture, config kwargs)
    "llama-gqa1": ("llama", dict(vocab_size=101, hidden_size=32, intermediate_size=56, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False)),
    "llama-gqa3-llama3rope": ("llama", dict(vocab_size=97, hidden_size=48, intermediate_size=72, num_hidden_layers=3,
                                            num_attention_heads=6, num_key_value_heads=2, tie_word_embeddings=False,
                                            rope_theta=500000.0,
                                            rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                          "high_freq_factor": 4.0,
                                                          "original_max_position_embeddings": 32})),
    "llama-gqa4-headdim-tied": ("llama", dict(vocab_size=89, hidden_size=40, intermediate_size=46, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=1, head_dim=8,
                                          tie_word_embeddings=True)),
    "mistral-gqa2": ("mistral", dict(vocab_size=83, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, sliding_window=None)),
    "qwen2-gqa5-tied": ("qwen2", dict(vocab_size=103, hidden_size=40, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=5, num_key_value_heads=1, tie_word_embeddings=True,
                                      rope_theta=1000000.0)),
    "gpt2-odd": ("gpt2", dict(vocab_size=107, n_embd=36, n_layer=3, n_head=3, n_positions=64)),
    # Sliding windows (5 and 6) are shorter than the test prompts, so keys leave the window in prefill and decode.
    "mistral-gqa4-window": ("mistral", dict(vocab_size=79, hidden_size=48, intermediate_size=40, num_hidden_layers=2,
                                            num_attention_heads=4, num_key_value_heads=1, sliding_window=5)),
    "llama32-gqa2-tied": ("llama", dict(vocab_size=97, hidden_size=64, intermediate_size=80, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                                        rope_theta=500000.0,
                                        rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                                      "high_freq_factor": 4.0,
                                                      "original_max_position_embeddings": 16})),
    "qwen25-gqa3": ("qwen2", dict(vocab_size=91, hidden_size=48, intermediate_size=88, num_hidden_layers=2,
                                  num_attention_heads=6, num_key_value_heads=2, tie_word_embeddings=False,
                                  rope_theta=1000000.0, use_sliding_window=False, sliding_window=32768,
                                  max_window_layers=1)),
    "qwen3-gqa2-headdim-window": ("qwen3", dict(vocab_size=101, hidden_size=32, intermediate_size=48,
                                                num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                                head_dim=12, tie_word_embeddings=True, rope_theta=1000000.0,
                                                use_sliding_window=True, sliding_window=6, max_window_layers=1)),
    "gemma2-gqa2-softcap": ("gemma2", dict(vocab_size=97, hidden_size=32, intermediate_size=40, num_hidden_layers=3,
                                           num_attention_heads=4, num_key_value_heads=2, head_dim=12,
                                           query_pre_attn_scalar=10, sliding_window=5,
                                           attn_logit_softcapping=2.0, final_logit_softcapping=3.0)),
    "gemma3-gqa4-local-global": ("gemma3", dict(vocab_size=89, hidden_size=24, intermediate_size=40,
                                                num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=1,
                                                head_dim=16, query_pre_attn_scalar=16, sliding_window=6,
                                                layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                                                rope_parameters={
                                                    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                                    "full_attention": {"rope_type": "linear", "factor": 8.0,
                                                                       "rope_theta": 1000000.0}})),
    "phi3-longrope-partial-window": ("phi3", dict(vocab_size=83, hidden_size=32, intermediate_size=56,
                                                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                                  partial_rotary_factor=0.5, sliding_window=6, pad_token_id=0, eos_token_id=1,
                                                  original_max_position_embeddings=128,
                                                  rope_scaling={"type": "longrope", "short_factor": [1.0, 1.7],
                                                                "long_factor": [3.0, 5.0], "attention_factor": 1.2})),
    "smollm3-nope-yarn": ("smollm3", dict(vocab_size=103, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                          num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                                          pad_token_id=0, bos_token_id=1, eos_token_id=2,
                                          rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                        "original_max_position_embeddings": 32})),
}


# Not in TINY (every architecture test runs over TINY): hidden and intermediate sizes of several blocks of 32,
# so the cpu target's integer kernels take their multi-block paths (two blocks per 512-bit step, odd tails).
WIDE = {
    "llama-wide": ("llama", dict(vocab_size=131, hidden_size=96, intermediate_size=160, num_hidden_layers=2,
                                 num_attention_heads=6, num_key_value_heads=2, tie_word_embeddings=False)),
    # Every matmul dimension a multiple of 32 and the vocabulary of 16 (a tied head in the interleaved layout):
    # the cpu target's integer kernels run every linear, as for real models (tests/runtime/test_batch.py).
    "qwen3-x32": ("qwen3", dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True,
                                rope_theta=1000000.0)),
}


# Not in TINY either: a second shape of each new architecture, for the logits test alone
# (tests/models/test_tiny_logits.py; the kernel and package tests run the TINY shape of each).
SHAPES = {
    "qwen3-gqa1-untied": ("qwen3", dict(vocab_size=67, hidden_size=48, intermediate_size=40, num_hidden_layers=2,
                                        num_attention_heads=3, num_key_value_heads=3, head_dim=16,
                                        tie_word_embeddings=False)),
    "gemma2-gqa4-window3": ("gemma2", dict(vocab_size=71, hidden_size=40, intermediate_size=24, num_hidden_layers=4,
                                           num_attention_heads=8, num_key_value_heads=2, head_dim=8,
                                           query_pre_attn_scalar=32, sliding_window=3, attn_logit_softcapping=5.0,
                                           final_logit_softcapping=8.0, tie_word_embeddings=False)),
    "gemma3-gqa1-pattern2": ("gemma3", dict(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                                            num_attention_heads=2, num_key_value_heads=2, head_dim=24,
                                            query_pre_attn_scalar=20, sliding_window=4, sliding_window_pattern=2,
                                            attn_logit_softcapping=4.0)),
    "phi3-mini-gqa1-window": ("phi3", dict(vocab_size=73, hidden_size=48, intermediate_size=32, num_hidden_layers=2,
                                           num_attention_heads=6, num_key_value_heads=6, sliding_window=4,
                                           pad_token_id=0, eos_token_id=1, tie_word_embeddings=True)),
    "smollm3-gqa3-interval2": ("smollm3", dict(vocab_size=79, hidden_size=48, intermediate_size=40,
                                               num_hidden_layers=4, num_attention_heads=6, num_key_value_heads=2,
                                               no_rope_layer_interval=2, use_sliding_window=True, sliding_window=5,
                                               pad_token_id=0, bos_token_id=1, eos_token_id=2)),
}


def fixture_home() -> Path:
    return Path(os.environ.get("DEPLOYCC_HOME", Path.home() / ".cache" / "deploycc")) / "test-fixtures"


def make_tiny(name: str, seed: int = 0) -> Path:
    """Write (once) the checkpoint `name` of TINY and return its directory."""
    out = fixture_home() / name
    if (out / "config.json").exists() and any(out.glob("*.safetensors")):
        return out
    import torch
    import transformers as tf

    arch, kwargs = {**TINY, **WIDE, **SHAPES}[name]
    cfg_cls, model_cls = {
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
        "mistral": (tf.MistralConfig, tf.MistralForCausalLM),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
        "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM),
        "gemma2": (tf.Gemma2Config, tf.Gemma2ForCausalLM),
        "gemma3": (tf.Gemma3TextConfig, tf.Gemma3ForCausalLM),
        "phi3": (tf.Phi3Config, tf.Phi3ForCausalLM),
        "smollm3": (tf.SmolLM3Config, tf.SmolLM3ForCausalLM),
        "gpt2": (tf.GPT2Config, tf.GPT2LMHeadModel),
    }[arch]
    torch.manual_seed(seed)
    extra = {} if arch == "gpt2" else {"max_position_embeddings": 128}
    cfg = cfg_cls(**kwargs, **extra)
    model = model_cls(cfg).eval()
    # Random init of norms is all-ones and biases zeros; perturb them so that they are tested.
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(torch.randn_like(p) * 0.1)
    # Parallel test workers may race to write the same fixture: write privately, then rename.
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    model.save_pretrained(tmp)
    try:
        tmp.rename(out)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def load_hf(path: Path):
    import transformers as tf

    return tf.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
