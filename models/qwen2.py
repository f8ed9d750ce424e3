"""Qwen2 / Qwen2.5: the Llama architecture with biases on the q/k/v projections (none on o_proj), and
sliding-window attention on the layers from `max_window_layers` on where `use_sliding_window` is set."""
from __future__ import annotations

from dataclasses import dataclass

from ._config import value
from .llama import LAYERS, LlamaConfig, LlamaForCausalLM, shape_facts, weight_map  # noqa: F401


@dataclass
class Qwen2Config(LlamaConfig):
    WINDOWED = "use_sliding_window"
    @classmethod
    def from_hf(cls, hf: dict, **overrides) -> Qwen2Config:
        cfg = super().from_hf(hf, **overrides)
        cfg.qkv_bias, cfg.o_bias, cfg.mlp_bias = True, False, False
        if cfg.sliding_window:  # where config.json has no layer_types: from max_window_layers on
            first = value(hf, "max_window_layers", 0)
            if isinstance(first, bool) or not isinstance(first, int) or first < 0:
                raise ValueError(f"max_window_layers must be a non-negative integer, got {first!r}")
            cfg.sliding_from = first
        return cfg


class Qwen2ForCausalLM(LlamaForCausalLM):
    pass


Config = Qwen2Config
Model = Qwen2ForCausalLM
