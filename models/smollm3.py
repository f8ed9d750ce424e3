"""SmolLM3: the Llama architecture without rotary embedding on every `no_rope_layer_interval`-th layer
(`no_rope_layers[i]` is 1 where layer i rotates, 0 where it does not: NoPE), YaRN where configured,
and sliding windows only where `use_sliding_window` is set (by default on the NoPE layers, as
transformers derives layer_types)."""
from __future__ import annotations

from dataclasses import dataclass

from ._config import count, value
from .llama import LAYERS, LlamaConfig, LlamaForCausalLM, shape_facts, weight_map  # noqa: F401


@dataclass
class SmolLM3Config(LlamaConfig):
    no_rope_layers: tuple[int, ...] = ()  # config.json's, where given
    no_rope_layer_interval: int = 4  # else: every interval-th layer is NoPE
    WINDOWED = "use_sliding_window"

    @classmethod
    def from_hf(cls, hf: dict, **overrides) -> SmolLM3Config:
        cfg = super().from_hf(hf, **overrides)
        flags = value(hf, "no_rope_layers", None)
        if flags is not None:
            if not isinstance(flags, list) or len(flags) != cfg.num_hidden_layers or any(f not in (0, 1) for f in flags):
                raise ValueError(f"no_rope_layers must list {cfg.num_hidden_layers} values of 1 (rotary) or 0 (none), "
                                 f"got {str(flags)[:80]}")
            cfg.no_rope_layers = tuple(int(f) for f in flags)
        cfg.no_rope_layer_interval = count(hf, "no_rope_layer_interval", 4)
        return cfg

    def rotates(self, layer: int) -> bool:
        if self.no_rope_layers:
            return bool(self.no_rope_layers[layer])
        return (layer + 1) % self.no_rope_layer_interval != 0

    def slides(self, layer: int) -> bool:
        if not self.layer_types:  # transformers: the NoPE layers slide
            return not self.rotates(layer)
        return super().slides(layer)


class SmolLM3ForCausalLM(LlamaForCausalLM):
    pass


Config = SmolLM3Config
Model = SmolLM3ForCausalLM
