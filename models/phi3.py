"""Phi-3, Phi-3.5 and Phi-4-mini: the Llama architecture with the q/k/v projections fused into one
`qkv_proj` and gate/up into one `gate_up_proj` in the checkpoint (kept fused here: one matmul each,
split after), LongRoPE scaling (short factors, or long ones where the context window exceeds
original_max_position_embeddings, and the attention factor on cos and sin), rotation of the first
`partial_rotary_factor` of each head (Phi-4-mini: 3/4), and a sliding window on every layer where
config.json sets `sliding_window` (Phi-3-mini: 2047)."""
from __future__ import annotations

from dataclasses import dataclass

from deploycc import nn
from deploycc.nn import op

from .llama import (  # noqa: F401
    LAYERS,
    LlamaAttention,
    LlamaConfig,
    LlamaDecoderLayer,
    LlamaForCausalLM,
    LlamaModel,
    weight_map,
)


@dataclass
class Phi3Config(LlamaConfig):
    WINDOWED = True


class Phi3Attention(LlamaAttention):
    def projections(self, cfg: Phi3Config) -> None:
        self.qkv_proj = nn.Linear(cfg.hidden_size, (self.heads + 2 * self.kv_heads) * self.head_dim, bias=cfg.qkv_bias)

    def project(self, x: nn.Tensor) -> tuple[nn.Tensor, nn.Tensor, nn.Tensor]:
        n, d = x.shape[1], self.head_dim
        q, k, v = op.split(self.qkv_proj(x), [self.heads * d, self.kv_heads * d, self.kv_heads * d], axis=-1)
        return q.reshape(n, self.heads, d), k.reshape(n, self.kv_heads, d), v.reshape(n, self.kv_heads, d)


class Phi3MLP(nn.Module):
    def __init__(self, cfg: Phi3Config):
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)
        self.intermediate = cfg.intermediate_size

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        gate, up = op.split(self.gate_up_proj(x), [self.intermediate, self.intermediate], axis=-1)
        return self.down_proj(up * op.silu(gate))


class Phi3DecoderLayer(LlamaDecoderLayer):
    ATTENTION, MLP = Phi3Attention, Phi3MLP


class Phi3Model(LlamaModel):
    LAYER = Phi3DecoderLayer


class Phi3ForCausalLM(LlamaForCausalLM):
    MODEL = Phi3Model


def shape_facts(cfg: Phi3Config) -> list[tuple[str, int, str, int]]:
    attn = "model.layers.0.self_attn."
    d = cfg.head_dim
    return [("vocab_size", cfg.vocab_size, "model.embed_tokens.weight", 0),
            ("hidden_size", cfg.hidden_size, "model.embed_tokens.weight", 1),
            ("intermediate_size", cfg.intermediate_size, "model.layers.0.mlp.down_proj.weight", 1),
            ("(num_attention_heads + 2 * num_key_value_heads) * head_dim",
             (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * d, attn + "qkv_proj.weight", 0)]


Config = Phi3Config
Model = Phi3ForCausalLM
