"""Llama family (Llama 2/3, SmolLM2, TinyLlama), and the base of its relatives (Mistral, Qwen2/3,
SmolLM3, Phi-3): GQA, SwiGLU, RMSNorm, rotary embedding.

Mirrors transformers' `modeling_llama.py`; parameter names equal the Hugging Face ones, so the
weight-name map is the identity. What the relatives change is in the config: a sliding window and
the layers it applies to (`window(layer)`), whether a layer rotates at all (`rotates(layer)`), and
per-head RMSNorm of q and k (`qk_norm`).
"""
from __future__ import annotations

from dataclasses import dataclass

from deploycc import nn
from deploycc.nn import op

from ._causal import CausalLM
from ._config import apply_overrides, count, flag, positive, value
from ._rope import Rope, rope_of

LAYER_TYPES = ("full_attention", "sliding_attention")


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
    rope: Rope
    tie_word_embeddings: bool
    max_position_embeddings: int
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    context_window: int = 0
    # Sliding-window attention: the window (0: none), and which layers use it. Held as a rule, not a list
    # per layer, so that a config naming 10**9 layers is refused (by the tensor check) before anything
    # of that size exists.
    sliding_window: int = 0
    layer_types: tuple[str, ...] = ()  # config.json's, where given: "sliding_attention" or "full_attention"
    sliding_from: int = 0  # else: layers from this one on slide (Qwen2's max_window_layers) ...
    global_every: int = 0  # ... but every global_every-th is global (Gemma 2: 2, Gemma 3: 6)
    qk_norm: bool = False  # RMSNorm over each head of q and k before rotation (Qwen3)
    # Whether config.json's sliding_window applies: never (Llama), always (True), or where the flag of this
    # key is set (Qwen2's and SmolLM3's "use_sliding_window").
    WINDOWED: bool | str = False

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
        bias = flag(hf, "attention_bias", False)
        layers, positions = count(hf, "num_hidden_layers"), count(hf, "max_position_embeddings", 2048)
        cfg = cls(
            vocab_size=count(hf, "vocab_size"), hidden_size=hidden, intermediate_size=count(hf, "intermediate_size"),
            num_hidden_layers=layers, num_attention_heads=heads,
            num_key_value_heads=kv_heads, head_dim=head_dim, rms_norm_eps=positive(hf, "rms_norm_eps", 1e-6, hi=1.0),
            rope=rope_of(hf, head_dim, positions), tie_word_embeddings=flag(hf, "tie_word_embeddings", False),
            max_position_embeddings=positions,
            qkv_bias=bias, o_bias=bias, mlp_bias=flag(hf, "mlp_bias", False),
            layer_types=layer_types(hf, layers),
            sliding_window=count(hf, "sliding_window") if cls.windowed(hf) else 0,
        )
        apply_overrides(cfg, overrides)
        if not cfg.context_window:
            cfg.context_window = min(cfg.max_position_embeddings, 4096)
        return cfg

    @classmethod
    def windowed(cls, hf: dict) -> bool:
        on = flag(hf, cls.WINDOWED, False) if isinstance(cls.WINDOWED, str) else cls.WINDOWED
        return on and value(hf, "sliding_window", None) is not None

    def slides(self, layer: int) -> bool:
        """Whether `layer` is a local (sliding-window) layer: config.json's layer_types, else the rule."""
        if self.layer_types:
            return self.layer_types[layer] == "sliding_attention"
        every = self.global_every
        return layer >= self.sliding_from and not (every and (layer + 1) % every == 0)

    def window(self, layer: int) -> int:
        """The sliding window of `layer`, 0 for global attention."""
        return self.sliding_window if self.sliding_window and self.slides(layer) else 0

    def rotates(self, layer: int) -> bool:
        """Whether `layer` applies rotary embedding (all but SmolLM3's NoPE layers)."""
        return True

    @property
    def max_context_window(self) -> int:
        """Positions the model was trained for: a longer cache would rotate keys past anything it saw."""
        return self.max_position_embeddings


class LlamaAttention(nn.Module):
    def __init__(self, cfg: LlamaConfig, layer: int):
        h, d = cfg.hidden_size, cfg.head_dim
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, d
        self.projections(cfg)
        self.o_proj = nn.Linear(self.heads * d, h, bias=cfg.o_bias)
        if cfg.qk_norm:
            self.q_norm = nn.RMSNorm(d, cfg.rms_norm_eps)
            self.k_norm = nn.RMSNorm(d, cfg.rms_norm_eps)
        self.rope = cfg.rope if cfg.rotates(layer) else None
        self.window, self.softcap, self.scale = cfg.window(layer), 0.0, d ** -0.5

    def projections(self, cfg: LlamaConfig) -> None:
        """The q/k/v projections (Phi-3 fuses them into one)."""
        h, d = cfg.hidden_size, self.head_dim
        self.q_proj = nn.Linear(h, self.heads * d, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(h, self.kv_heads * d, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(h, self.kv_heads * d, bias=cfg.qkv_bias)

    def project(self, x: nn.Tensor) -> tuple[nn.Tensor, nn.Tensor, nn.Tensor]:
        """q [n, heads, head_dim], k and v [n, kv_heads, head_dim] of x [1, n, hidden]."""
        n = x.shape[1]
        return (self.q_proj(x).reshape(n, self.heads, self.head_dim),
                self.k_proj(x).reshape(n, self.kv_heads, self.head_dim),
                self.v_proj(x).reshape(n, self.kv_heads, self.head_dim))

    def forward(self, x: nn.Tensor, cache: nn.Cache, layer: int, rope) -> nn.Tensor:
        """rope: the step's cos/sin table of this layer's rotation (op.rope_table, shared by the layers that
        rotate alike), None for a layer without."""
        n = x.shape[1]
        q, k, v = self.project(x)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        if rope is not None:
            q, k = op.rope_apply(q, rope), op.rope_apply(k, rope)
        o = cache.attend(layer, q, k, v, scale=self.scale, window=self.window, softcap=self.softcap)
        return self.o_proj(o.reshape(1, n, self.heads * self.head_dim))


def rope_tables(h: nn.Tensor, attns, offset, context: int) -> list:
    """Per layer, the cos/sin table of its rotation for the positions of h from `offset` on (or at the positions
    of a tensor); one table per
    distinct rotation (computed once a step, shared by every layer that rotates alike), None where a
    layer does not rotate."""
    tables, out = {}, []
    for attn in attns:
        if attn.rope is None:
            out.append(None)
            continue
        if attn.rope not in tables:
            freq, scale = attn.rope.frequencies(context)
            tables[attn.rope] = op.rope_table(h, freq, offset, scale)
        out.append(tables[attn.rope])
    return out


def layer_types(hf: dict, layers: int) -> tuple[str, ...]:
    """config.json's layer_types, checked: one of LAYER_TYPES per layer (empty where absent)."""
    types = value(hf, "layer_types", None)
    if types is None:
        return ()
    if not isinstance(types, list) or len(types) != layers or any(t not in LAYER_TYPES for t in types):
        raise ValueError(f"layer_types must list {layers} of {' or '.join(LAYER_TYPES)}, got {str(types)[:80]}")
    return tuple(types)


class LlamaMLP(nn.Module):
    ACT = staticmethod(op.silu)  # SwiGLU; Gemma's GeGLU: gelu_tanh

    def __init__(self, cfg: LlamaConfig):
        h, i = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(h, i, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(i, h, bias=cfg.mlp_bias)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return self.down_proj(self.ACT(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    ATTENTION, MLP = LlamaAttention, LlamaMLP  # a relative's (Phi-3)

    def __init__(self, cfg: LlamaConfig, layer: int):
        self.self_attn = self.ATTENTION(cfg, layer)
        self.mlp = self.MLP(cfg)
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: nn.Tensor, cache: nn.Cache, layer: int, rope) -> nn.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cache, layer, rope)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    LAYER = LlamaDecoderLayer  # a relative's decoder layer (Gemma, Phi-3)

    def __init__(self, cfg: LlamaConfig):
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(self.LAYER(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = nn.RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(CausalLM):
    MODEL = LlamaModel

    def __init__(self, cfg: LlamaConfig):
        self.config = cfg
        self.model = self.MODEL(cfg)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size)

    def embed(self, input_ids: nn.Tensor) -> nn.Tensor:
        return self.model.embed_tokens(input_ids)

    def head(self, h: nn.Tensor) -> nn.Tensor:
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return op.linear(h, weight)

    def forward(self, input_ids: nn.Tensor, cache: nn.Cache, last_only: bool = False) -> nn.Tensor:
        positions = cache.begin(input_ids.shape[1])  # the first's, or each token's in a batched step
        h = self.embed(input_ids)
        context = cache.capacity or self.config.context_window  # the cache's (export's) context window
        ropes = rope_tables(h, [layer.self_attn for layer in self.model.layers], positions, context)
        for i, (layer, rope) in enumerate(zip(self.model.layers, ropes)):
            h = layer(h, cache, i, rope)
        if last_only:  # generation needs the last position's logits only: skip the head elsewhere
            h = cache.last(h)
        return self.head(self.model.norm(h))


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
