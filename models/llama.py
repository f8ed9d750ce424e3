"""Llama family (Llama 2/3, Mistral, SmolLM2, TinyLlama): GQA, SwiGLU, RMSNorm, rotary embedding.

Mirrors transformers' `modeling_llama.py`; parameter names equal the Hugging Face ones, so the
weight-name map is the identity.
"""
from __future__ import annotations

from dataclasses import dataclass

from deploycc import nn
from deploycc.nn import op

from ._config import apply_overrides, count, flag, positive
from ._rope import inv_freq, rope_parameters


@dataclass
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    tie_word_embeddings: bool
    max_position_embeddings: int
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    context_window: int = 0

    @classmethod
    def from_hf(cls, hf: dict, **overrides) -> LlamaConfig:
        hidden, heads = count(hf, "hidden_size"), count(hf, "num_attention_heads")
        kv_heads = count(hf, "num_key_value_heads", heads)
        if "head_dim" not in hf or hf["head_dim"] is None:
            if hidden % heads:
                raise ValueError(f"num_attention_heads {heads} does not divide hidden_size {hidden}; "
                                 f"fix one of them or give head_dim")
            head_dim = hidden // heads
        else:
            head_dim = count(hf, "head_dim")
        if heads % kv_heads:
            raise ValueError(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
        if head_dim % 2:
            raise ValueError(f"head_dim {head_dim} is odd; rotary embeddings rotate pairs of dimensions")
        theta, scaling = rope_parameters(hf)
        bias = flag(hf, "attention_bias", False)
        cfg = cls(
            vocab_size=count(hf, "vocab_size"), hidden_size=hidden, intermediate_size=count(hf, "intermediate_size"),
            num_hidden_layers=count(hf, "num_hidden_layers"), num_attention_heads=heads,
            num_key_value_heads=kv_heads, head_dim=head_dim, rms_norm_eps=positive(hf, "rms_norm_eps", 1e-6, hi=1.0),
            rope_theta=theta, rope_scaling=scaling, tie_word_embeddings=flag(hf, "tie_word_embeddings", False),
            max_position_embeddings=count(hf, "max_position_embeddings", 2048),
            qkv_bias=bias, o_bias=bias, mlp_bias=flag(hf, "mlp_bias", False),
        )
        apply_overrides(cfg, overrides)
        if not cfg.context_window:
            cfg.context_window = min(cfg.max_position_embeddings, 4096)
        return cfg

    @property
    def max_context_window(self) -> int:
        """Positions the model was trained for: a longer cache would rotate keys past anything it saw."""
        return self.max_position_embeddings


class LlamaAttention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        h, d = cfg.hidden_size, cfg.head_dim
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.q_proj = nn.Linear(h, self.heads * d, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(h, self.kv_heads * d, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(h, self.kv_heads * d, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(self.heads * d, h, bias=cfg.o_bias)
        self.inv_freq = inv_freq(d, cfg.rope_theta, cfg.rope_scaling)

    def forward(self, x: nn.Tensor, cache: nn.Cache, layer: int, rope) -> nn.Tensor:
        """rope: the step's cos/sin table (op.rope_table), computed once for all layers."""
        n = x.shape[1]
        q = self.q_proj(x).reshape(n, self.heads, self.head_dim)
        k = self.k_proj(x).reshape(n, self.kv_heads, self.head_dim)
        v = self.v_proj(x).reshape(n, self.kv_heads, self.head_dim)
        q, k = op.rope_apply(q, rope), op.rope_apply(k, rope)
        cache.append(layer, k, v)
        keys, values = cache.view(layer, self.kv_heads, self.head_dim)
        o = op.attention(q, keys, values, scale=self.head_dim ** -0.5)
        return self.o_proj(o.reshape(1, n, self.heads * self.head_dim))


class LlamaMLP(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        h, i = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(h, i, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(i, h, bias=cfg.mlp_bias)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return self.down_proj(op.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        self.self_attn = LlamaAttention(cfg)
        self.mlp = LlamaMLP(cfg)
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: nn.Tensor, cache: nn.Cache, layer: int, rope) -> nn.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cache, layer, rope)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = nn.RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        self.config = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size)

    def forward(self, input_ids: nn.Tensor, cache: nn.Cache, last_only: bool = False) -> nn.Tensor:
        n = input_ids.shape[1]
        total = cache.begin(n)
        h = self.model.embed_tokens(input_ids)
        rope = op.rope_table(h, self.model.layers[0].self_attn.inv_freq, total - n)
        for i, layer in enumerate(self.model.layers):
            h = layer(h, cache, i, rope)
        if last_only:  # generation needs the last position's logits only: skip the head elsewhere
            h = op.strided_slice(h, n - 1, n, axis=1)
        h = self.model.norm(h)
        head = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return op.linear(h, head)

    def prefill(self, input_ids: nn.Tensor, cache: nn.Cache) -> nn.Tensor:
        return self.forward(input_ids, cache, last_only=True)

    def prefill_all(self, input_ids: nn.Tensor, cache: nn.Cache) -> nn.Tensor:
        return self.forward(input_ids, cache)

    def decode(self, input_ids: nn.Tensor, cache: nn.Cache) -> nn.Tensor:
        return self.forward(input_ids, cache)


def weight_map(cfg) -> dict[str, tuple[str, str | None]]:
    """Ours -> (Hugging Face name, transform). Identity here: names and layouts agree."""
    return {}


# The config key that counts layers, and the prefix of every layer's tensors.
LAYERS = ("num_hidden_layers", "model.layers.")


def shape_facts(cfg: LlamaConfig) -> list[tuple[str, int, str, int]]:
    """(config keys, the size they give, a checkpoint tensor, the axis of it that must equal that size):
    checked against the safetensors headers before the model is built, so that a config that
    disagrees with its weights is named by key."""
    attn = "model.layers.0.self_attn."
    return [("vocab_size", cfg.vocab_size, "model.embed_tokens.weight", 0),
            ("hidden_size", cfg.hidden_size, "model.embed_tokens.weight", 1),
            ("intermediate_size", cfg.intermediate_size, "model.layers.0.mlp.down_proj.weight", 1),
            ("num_attention_heads * head_dim", cfg.num_attention_heads * cfg.head_dim, attn + "q_proj.weight", 0),
            ("num_key_value_heads * head_dim", cfg.num_key_value_heads * cfg.head_dim, attn + "k_proj.weight", 0)]


Config = LlamaConfig
Model = LlamaForCausalLM
