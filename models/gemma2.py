"""Gemma 2: local (sliding-window) and global layers alternating, attention scores capped at
attn_logit_softcapping and logits at final_logit_softcapping. The layers are models/gemma.py's."""
from __future__ import annotations

from dataclasses import dataclass

from .gemma import LAYERS, GemmaConfig, GemmaForCausalLM, shape_facts, weight_map  # noqa: F401


@dataclass
class Gemma2Config(GemmaConfig):
    @classmethod
    def from_hf(cls, hf: dict, **overrides) -> Gemma2Config:
        cfg = super().from_hf(hf, **overrides)
        cfg.global_every = 2  # local, global, local, ... where config.json has no layer_types
        return cfg


Config = Gemma2Config
Model = GemmaForCausalLM
