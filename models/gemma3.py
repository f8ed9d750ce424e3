"""Gemma 3 (text; Gemma3ForCausalLM, model_type gemma3_text): Gemma 2's layers with an RMSNorm over each
head of q and k, `sliding_window_pattern - 1` local layers to each global one, and a rotation of their own
for the local layers (rope_local_base_freq, unscaled) beside the global layers' (rope_theta with
rope_scaling). The layers are models/gemma.py's."""
from __future__ import annotations

from dataclasses import dataclass

from ._config import positive
from ._rope import Rope, check_scaling, has_layer_rope, rope_of
from .gemma import LAYERS, GemmaConfig, GemmaForCausalLM, shape_facts, weight_map  # noqa: F401


@dataclass
class Gemma3Config(GemmaConfig):
    PATTERN = 6  # five local layers, then a global one, where config.json has no layer_types

    @classmethod
    def from_hf(cls, hf: dict, **overrides) -> Gemma3Config:
        cfg = super().from_hf(hf, **overrides)  # the global layers' rotation: rope_parameters' full_attention
        cfg.qk_norm = True
        cfg.attn_logit_softcapping = 0.0  # a Gemma 3 config may name one; transformers' Gemma 3 never applies it
        positions = cfg.max_position_embeddings
        if has_layer_rope(hf, "sliding_attention"):  # transformers 5: one rope_parameters per layer type
            cfg.local_rope = rope_of(hf, cfg.head_dim, positions, "sliding_attention")
        else:  # transformers 4: rope_local_base_freq, unscaled
            theta = positive(hf, "rope_local_base_freq", 10000.0)
            cfg.local_rope = Rope(theta, check_scaling({}, hf), cfg.rope.dim, positions)
        return cfg



Config = Gemma3Config
Model = GemmaForCausalLM
