"""Qwen3: Qwen2 without the q/k/v biases, with an RMSNorm over each head of q and k before rotation
(QK-norm) and a head_dim of its own (not hidden_size / heads)."""
from __future__ import annotations

from dataclasses import dataclass

from ._config import flag
from .llama import LAYERS, LlamaForCausalLM, weight_map  # noqa: F401
from .llama import shape_facts as llama_facts
from .qwen2 import Qwen2Config


@dataclass
class Qwen3Config(Qwen2Config):
    @classmethod
    def from_hf(cls, hf: dict, **overrides) -> Qwen3Config:
        cfg = super().from_hf(hf, **overrides)
        bias = flag(hf, "attention_bias", False)
        cfg.qkv_bias, cfg.o_bias, cfg.qk_norm = bias, bias, True
        return cfg


class Qwen3ForCausalLM(LlamaForCausalLM):
    pass


def shape_facts(cfg: Qwen3Config) -> list[tuple[str, int, str, int]]:
    return llama_facts(cfg) + [("head_dim", cfg.head_dim, "model.layers.0.self_attn.q_norm.weight", 0)]


Config = Qwen3Config
Model = Qwen3ForCausalLM
