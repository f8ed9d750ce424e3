"""Tiny random-weight Hugging Face checkpoints of every supported architecture, made with
transformers into a cache outside the repo ($DEPLOYCC_HOME/test-fixtures, default ~/.cache/deploycc).

The shapes are chosen to catch indexing mistakes: GQA ratios 1, 3 and 4 (and 5), hidden sizes that
differ from heads * head_dim (explicit head_dim), odd vocabularies, tied and untied heads,
rope scaling, 2-3 layers.
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
}


# Not in TINY (every architecture test runs over TINY): hidden and intermediate sizes of several blocks of 32,
# so the cpu target's integer kernels take their multi-block paths (two blocks per 512-bit step, odd tails).
WIDE = {
    "llama-wide": ("llama", dict(vocab_size=131, hidden_size=96, intermediate_size=160, num_hidden_layers=2,
                                 num_attention_heads=6, num_key_value_heads=2, tie_word_embeddings=False)),
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

    arch, kwargs = {**TINY, **WIDE}[name]
    cfg_cls, model_cls = {
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
        "mistral": (tf.MistralConfig, tf.MistralForCausalLM),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
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
