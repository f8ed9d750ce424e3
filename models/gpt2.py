"""GPT-2: LayerNorm, learned positions, GELU (tanh form), fused QKV, tied head.

Mirrors transformers' `modeling_gpt2.py`. GPT-2 stores its projections as Conv1D with weights
[in, out]; ours are Linear [out, in], so the weight map transposes them on load.
"""
from __future__ import annotations

from dataclasses import dataclass

from deploycc import nn
from deploycc.nn import op

from ._causal import CausalLM
from ._config import apply_overrides, count, positive, text


@dataclass
class GPT2Config:
    vocab_size: int
    n_embd: int
    n_layer: int
    n_head: int
    n_inner: int
    n_positions: int
    layer_norm_epsilon: float
    context_window: int = 0

    @classmethod
    def from_hf(cls, hf: dict, **overrides) -> GPT2Config:
        embd, heads = count(hf, "n_embd"), count(hf, "n_head")
        if embd % heads:
            raise ValueError(f"n_head {heads} does not divide n_embd {embd}; fix one of them")
        cfg = cls(vocab_size=count(hf, "vocab_size"), n_embd=embd, n_layer=count(hf, "n_layer"), n_head=heads,
                  n_inner=count(hf, "n_inner", 4 * embd), n_positions=count(hf, "n_positions"),
                  layer_norm_epsilon=positive(hf, "layer_norm_epsilon", 1e-5, hi=1.0))
        act = text(hf, "activation_function", "gelu_new")
        if act not in ("gelu_new", "gelu_pytorch_tanh"):
            raise ValueError(f"GPT-2 activation {act!r} is not supported (supported: gelu_new, gelu_pytorch_tanh)")
        apply_overrides(cfg, overrides)
        # Learned positions end at n_positions: the context window cannot exceed it.
        cfg.context_window = min(cfg.context_window or cfg.n_positions, cfg.n_positions)
        return cfg

    @property
    def max_context_window(self) -> int:
        return self.n_positions

    @property
    def num_hidden_layers(self) -> int:
        return self.n_layer

    @property
    def num_key_value_heads(self) -> int:
        return self.n_head

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


class GPT2Attention(nn.Module):
    def __init__(self, cfg: GPT2Config):
        self.heads, self.head_dim, self.embd = cfg.n_head, cfg.head_dim, cfg.n_embd
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=True)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=True)

    def forward(self, x: nn.Tensor, cache: nn.Cache, layer: int) -> nn.Tensor:
        n = x.shape[1]
        q, k, v = op.split(self.c_attn(x), [self.embd] * 3, axis=-1)
        q, k, v = (t.reshape(n, self.heads, self.head_dim) for t in (q, k, v))
        o = cache.attend(layer, q, k, v, scale=self.head_dim ** -0.5)
        return self.c_proj(o.reshape(1, n, self.embd))


class GPT2MLP(nn.Module):
    def __init__(self, cfg: GPT2Config):
        self.c_fc = nn.Linear(cfg.n_embd, cfg.n_inner, bias=True)
        self.c_proj = nn.Linear(cfg.n_inner, cfg.n_embd, bias=True)

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return self.c_proj(op.gelu_tanh(self.c_fc(x)))


class GPT2Block(nn.Module):
    def __init__(self, cfg: GPT2Config):
        self.ln_1 = nn.LayerNorm(cfg.n_embd, cfg.layer_norm_epsilon)
        self.attn = GPT2Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, cfg.layer_norm_epsilon)
        self.mlp = GPT2MLP(cfg)

    def forward(self, x: nn.Tensor, cache: nn.Cache, layer: int) -> nn.Tensor:
        x = x + self.attn(self.ln_1(x), cache, layer)
        return x + self.mlp(self.ln_2(x))


class GPT2Model(nn.Module):
    def __init__(self, cfg: GPT2Config):
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.n_positions, cfg.n_embd)
        self.h = nn.ModuleList(GPT2Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, cfg.layer_norm_epsilon)


class GPT2LMHeadModel(CausalLM):
    def __init__(self, cfg: GPT2Config):
        self.config = cfg
        self.transformer = GPT2Model(cfg)

    def forward(self, input_ids: nn.Tensor, cache: nn.Cache, last_only: bool = False) -> nn.Tensor:
        n = input_ids.shape[1]
        first = cache.begin(n)  # the first token's position, or each token's in a batched step
        positions = first.reshape(1, n) if isinstance(first, nn.Tensor) else op.arange(input_ids, first, first + n)
        h = self.transformer.wte(input_ids) + self.transformer.wpe(positions)
        for i, block in enumerate(self.transformer.h):
            h = block(h, cache, i)
        if last_only:
            h = cache.last(h)
        return op.linear(self.transformer.ln_f(h), self.transformer.wte.weight)


_CONV1D = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")


def weight_map(cfg: GPT2Config) -> dict[str, tuple[str, str | None]]:
    """Ours -> (Hugging Face name, transform): Conv1D weights are stored transposed."""
    out = {}
    for i in range(cfg.n_layer):
        for m in _CONV1D:
            name = f"transformer.h.{i}.{m}.weight"
            out[name] = (name, "transpose")
    return out


LAYERS = ("n_layer", "transformer.h.")


def shape_facts(cfg: GPT2Config) -> list[tuple[str, int, str, int]]:
    """As llama.shape_facts; Conv1D weights are stored [in, out]."""
    return [("vocab_size", cfg.vocab_size, "transformer.wte.weight", 0),
            ("n_embd", cfg.n_embd, "transformer.wte.weight", 1),
            ("n_positions", cfg.n_positions, "transformer.wpe.weight", 0),
            ("n_inner", cfg.n_inner, "transformer.h.0.mlp.c_fc.weight", 1)]


Config = GPT2Config
Model = GPT2LMHeadModel
