"""Qwen2: the Llama architecture with biases on the q/k/v projections (none on o_proj)."""
from __future__ import annotations

from dataclasses import dataclass

from .llama import LAYERS, LlamaConfig, LlamaForCausalLM, shape_facts, weight_map  # noqa: F401


@dataclass
class Qwen2Config(LlamaConfig):
    @classmethod
    def from_hf(cls, hf: dict, **overrides) -> Qwen2Config:
        cfg = super().from_hf(hf, **overrides)
        cfg.qkv_bias, cfg.o_bias, cfg.mlp_bias = True, False, False
        return cfg


class Qwen2ForCausalLM(LlamaForCausalLM):
    pass


Config = Qwen2Config
Model = Qwen2ForCausalLM
