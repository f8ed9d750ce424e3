"""Gemma 3's multimodal checkpoints (Gemma3ForConditionalGeneration: Gemma 3 4B, 12B and 27B), text only.

The language model is models/gemma3.py's; its config is config.json's `text_config`, which the Hub's files
give sparsely (transformers fills the rest from Gemma3TextConfig's defaults, as TEXT_DEFAULTS does here),
and its tensors are under `language_model.`. The vision tower and the projector are not loaded: the
package chats in text.
"""
from __future__ import annotations

from dataclasses import dataclass

from .gemma import GemmaForCausalLM
from .gemma import weight_map as gemma_weights
from .gemma3 import Gemma3Config
from .llama import shape_facts as llama_facts

# transformers' Gemma3TextConfig() (tests/models/test_rope.py checks them against it)
TEXT_DEFAULTS = {"vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                 "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                 "max_position_embeddings": 131_072, "rms_norm_eps": 1e-6, "query_pre_attn_scalar": 256,
                 "sliding_window": 4096, "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0,
                 "hidden_activation": "gelu_pytorch_tanh", "sliding_window_pattern": 6}
PREFIX = "language_model."


@dataclass
class Gemma3MMConfig(Gemma3Config):
    @classmethod
    def from_hf(cls, hf: dict, **overrides) -> Gemma3MMConfig:
        text = hf.get("text_config")
        if not isinstance(text, dict):
            raise ValueError(f"text_config must be a mapping (the language model's config), got {str(text)[:60]}")
        nested = isinstance(text.get("rope_parameters"), dict)
        defaults = {k: v for k, v in TEXT_DEFAULTS.items()
                    if not (nested and k in ("rope_theta", "rope_local_base_freq"))}
        merged = {**defaults, "tie_word_embeddings": hf.get("tie_word_embeddings", True), **text}
        return super().from_hf(merged, **overrides)


def weight_map(cfg: Gemma3MMConfig) -> dict[str, tuple[str, str | None]]:
    """Ours -> the checkpoint's: every tensor under language_model., Gemma's norms 1 + w."""
    plus = gemma_weights(cfg)
    names = [name for name, _ in GemmaForCausalLM(cfg).named_parameters()]
    return {n: (PREFIX + n, plus.get(n, (n, None))[1]) for n in names}


LAYERS = ("num_hidden_layers", PREFIX + "model.layers.")


def shape_facts(cfg: Gemma3MMConfig) -> list[tuple[str, int, str, int]]:
    return [(what, size, PREFIX + tensor, axis) for what, size, tensor, axis in llama_facts(cfg)]


Config = Gemma3MMConfig
Model = GemmaForCausalLM
