"""Gemma 3's multimodal checkpoints (Gemma3ForConditionalGeneration: Gemma 3 4B, 12B and 27B), text only.

The language model is models/gemma3.py's; its config is config.json's `text_config`, which the Hub's files
give sparsely (transformers fills the rest from Gemma3TextConfig's defaults, as TEXT_DEFAULTS does here),
and its tensors are under `language_model.` (CHECKPOINT_PREFIX: deploycc.hub puts it before every name).
The vision tower and the projector are not loaded: the package chats in text.
"""
from __future__ import annotations

from dataclasses import dataclass

from .gemma import LAYERS, GemmaForCausalLM, shape_facts, weight_map  # noqa: F401
from .gemma3 import Gemma3Config

# transformers' Gemma3TextConfig() (tests/models/test_rope.py checks them against it)
TEXT_DEFAULTS = {"vocab_size": 262_208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                 "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                 "max_position_embeddings": 131_072, "rms_norm_eps": 1e-6, "query_pre_attn_scalar": 256,
                 "sliding_window": 4096, "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0,
                 "hidden_activation": "gelu_pytorch_tanh", "sliding_window_pattern": 6}
CHECKPOINT_PREFIX = "language_model."


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


Config = Gemma3MMConfig
Model = GemmaForCausalLM
