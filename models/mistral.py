"""Mistral: the Llama architecture with sliding-window attention on every layer where config.json
sets `sliding_window` (Mistral 7B v0.1: 4096; later versions: null, global attention)."""
from __future__ import annotations

from dataclasses import dataclass

from .llama import LAYERS, LlamaConfig, LlamaForCausalLM, shape_facts, weight_map  # noqa: F401


@dataclass
class MistralConfig(LlamaConfig):
    WINDOWED = True


class MistralForCausalLM(LlamaForCausalLM):
    pass


Config = MistralConfig
Model = MistralForCausalLM
