"""Gemma 2 and Gemma 3 (text): Llama-shaped attention with pre- and post-norms around attention and MLP,
GeGLU (gelu_pytorch_tanh), embeddings scaled by sqrt(hidden_size), attention scaled by
query_pre_attn_scalar ** -0.5, local (sliding-window) and global layers, and logit soft-capping.

Gemma's RMSNorm multiplies by (1 + w): the checkpoint's w becomes 1 + w once, at load ("plus_one" in
weight_map), so the norms are ordinary rms_norm ops. llama.cpp's GGUF files store 1 + w already.
Gemma 2 caps attention scores at 50 and the logits at 30 (c * tanh(x / c)); its layers alternate local
and global. Gemma 3 adds an RMSNorm over each head of q and k, five local layers to one global, and
rotary bases of their own for the local (10k) and the global (1M, linearly scaled) layers.
"""
from __future__ import annotations

from dataclasses import dataclass

from deploycc import nn
from deploycc.nn import op

from ._config import count, flag, positive, value
from ._rope import Rope
from .llama import LlamaAttention, LlamaConfig, LlamaForCausalLM, LlamaMLP, LlamaModel
from .llama import shape_facts as llama_facts

NORMS = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")


@dataclass
class GemmaConfig(LlamaConfig):
    query_pre_attn_scalar: float = 0.0
    attn_logit_softcapping: float = 0.0
    final_logit_softcapping: float = 0.0
    local_rope: Rope | None = None  # the sliding layers' rotation (Gemma 3); None: as the global layers
    norms_plus_one: bool = True  # the checkpoint stores w of x * (1 + w): add 1 at load (GGUF files store 1 + w)
    WINDOWED = True
    PATTERN = 2  # where config.json has no layer_types: every PATTERN-th layer is global (Gemma 2: alternate)

    @classmethod
    def from_hf(cls, hf: dict, **overrides) -> GemmaConfig:
        hf = dict(hf, tie_word_embeddings=value(hf, "tie_word_embeddings", True))
        if flag(hf, "use_bidirectional_attention", False):
            raise ValueError("use_bidirectional_attention is true: this is an embedding model, not a causal LM")
        cfg = super().from_hf(hf, **overrides)
        cfg.mlp_bias = False
        cfg.query_pre_attn_scalar = positive(hf, "query_pre_attn_scalar", float(cfg.head_dim))
        cfg.attn_logit_softcapping = _cap(hf, "attn_logit_softcapping")
        cfg.final_logit_softcapping = _cap(hf, "final_logit_softcapping")
        cfg.global_every = count(hf, "sliding_window_pattern", value(hf, "_sliding_window_pattern", cls.PATTERN))
        act = value(hf, "hidden_activation", value(hf, "hidden_act", "gelu_pytorch_tanh"))
        if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
            raise ValueError(f"hidden_activation {act!r} is not supported (Gemma uses gelu_pytorch_tanh)")
        return cfg


def _cap(hf: dict, key: str) -> float:
    return 0.0 if value(hf, key, None) is None else positive(hf, key, 0.0)


class GemmaAttention(LlamaAttention):
    def __init__(self, cfg: GemmaConfig, layer: int):
        super().__init__(cfg, layer)
        self.scale, self.softcap = cfg.query_pre_attn_scalar ** -0.5, cfg.attn_logit_softcapping
        if cfg.local_rope is not None and cfg.slides(layer):
            self.rope = cfg.local_rope


class GemmaMLP(LlamaMLP):
    ACT = staticmethod(op.gelu_tanh)  # GeGLU


class GemmaDecoderLayer(nn.Module):
    def __init__(self, cfg: GemmaConfig, layer: int):
        self.self_attn = GemmaAttention(cfg, layer)
        self.mlp = GemmaMLP(cfg)
        for norm in NORMS:
            setattr(self, norm, nn.RMSNorm(cfg.hidden_size, cfg.rms_norm_eps))

    def forward(self, x: nn.Tensor, cache: nn.Cache, layer: int, rope) -> nn.Tensor:
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cache, layer, rope))
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class GemmaModel(LlamaModel):
    LAYER = GemmaDecoderLayer


class GemmaForCausalLM(LlamaForCausalLM):
    """Llama's forward, with embeddings times sqrt(hidden_size) and the logits soft-capped."""
    MODEL = GemmaModel

    def embed(self, input_ids: nn.Tensor) -> nn.Tensor:
        return self.model.embed_tokens(input_ids) * float(self.config.hidden_size ** 0.5)

    def head(self, h: nn.Tensor) -> nn.Tensor:
        logits = super().head(h)
        cap = self.config.final_logit_softcapping
        return op.tanh(logits * (1.0 / cap)) * cap if cap else logits


def weight_map(cfg: GemmaConfig) -> dict[str, tuple[str, str | None]]:
    """Ours -> (Hugging Face name, transform): every RMSNorm weight w becomes 1 + w."""
    if not cfg.norms_plus_one:
        return {}
    names = ["model.norm.weight"]
    for i in range(cfg.num_hidden_layers):
        names += [f"model.layers.{i}.{norm}.weight" for norm in NORMS]
        if cfg.qk_norm:
            names += [f"model.layers.{i}.self_attn.{x}_norm.weight" for x in "qk"]
    return {name: (name, "plus_one") for name in names}


LAYERS = ("num_hidden_layers", "model.layers.")


def shape_facts(cfg: GemmaConfig) -> list[tuple[str, int, str, int]]:
    return llama_facts(cfg)


Model = GemmaForCausalLM
