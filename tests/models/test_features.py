"""Each architecture feature matters on its tiny fixture, so that the transformers comparison
(test_tiny_logits.py) fails where we implement it wrongly.

Removing a feature from our model (a field of the loaded config changed, the checkpoint untouched) must move the
reference logits, over a prompt longer than every window and 8 decode steps, by at least MARGIN times the
tolerance of that comparison; and the model with the feature must still match transformers within it. On
transformers' initialisation no feature did (Gemma 2's soft-cap moved the logits by 1e-6: attention was nearly
uniform, the logits a tenth of a unit); tests/fixtures.py gives the fixtures a trained model's magnitudes, and
test_fixtures_are_sharp checks that they have them.
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest
import torch

import deploycc
from fixtures import LOGIT_STD, SCORE_STD, SHAPES, TINY, WIDE, _attention_scores, load_hf, make_tiny

from .test_tiny_logits import check_logits, tolerance

MARGIN = 100
PROMPT, DECODE = 33, 8  # the longest prompt of the comparison; windows are 3 to 6


def fields(**changes):
    return lambda cfg: dataclasses.replace(cfg, **changes)


def unscaled_rope(cfg):
    return dataclasses.replace(cfg, rope=dataclasses.replace(cfg.rope, scaling=None))


def full_rotary(cfg):
    """Rotate all of each head (LongRoPE's factors, one per rotated pair, extended with ones)."""
    rope, pairs = cfg.rope, cfg.head_dim // 2
    scaling = {**rope.scaling, **{k: rope.scaling[k] + [1.0] * (pairs - rope.dim // 2)
                                  for k in ("short_factor", "long_factor")}}
    return dataclasses.replace(cfg, rope=dataclasses.replace(rope, dim=cfg.head_dim, scaling=scaling))


def every_layer_rotates(cfg):
    return dataclasses.replace(cfg, no_rope_layers=(1,) * cfg.num_hidden_layers)


def every_layer_local(cfg):
    return dataclasses.replace(cfg, layer_types=("sliding_attention",) * cfg.num_hidden_layers)


def head_dim_scale(cfg):
    """Gemma's attention scale without query_pre_attn_scalar: head_dim ** -0.5."""
    assert cfg.query_pre_attn_scalar != cfg.head_dim
    return dataclasses.replace(cfg, query_pre_attn_scalar=float(cfg.head_dim))


FEATURES = {
    # feature: (fixture, our config without it)
    "gemma2 attention soft-cap": ("gemma2-gqa2-softcap", fields(attn_logit_softcapping=0.0)),
    "gemma2 attention soft-cap (second shape)": ("gemma2-gqa4-window3", fields(attn_logit_softcapping=0.0)),
    "gemma2 final soft-cap": ("gemma2-gqa2-softcap", fields(final_logit_softcapping=0.0)),
    "gemma2 final soft-cap (second shape)": ("gemma2-gqa4-window3", fields(final_logit_softcapping=0.0)),
    "mistral sliding window": ("mistral-gqa4-window", fields(sliding_window=0)),
    "qwen3 sliding window": ("qwen3-gqa2-headdim-window", fields(sliding_window=0)),
    "gemma2 sliding window": ("gemma2-gqa2-softcap", fields(sliding_window=0)),
    "gemma3 sliding window": ("gemma3-gqa4-local-global", fields(sliding_window=0)),
    "phi3 sliding window": ("phi3-longrope-partial-window", fields(sliding_window=0)),
    "phi3 sliding window (second shape)": ("phi3-mini-gqa1-window", fields(sliding_window=0)),
    "smollm3 sliding window": ("smollm3-gqa3-interval2", fields(sliding_window=0)),
    "qwen3 qk-norm": ("qwen3-gqa2-headdim-window", fields(qk_norm=False)),
    "gemma3 qk-norm": ("gemma3-gqa4-local-global", fields(qk_norm=False)),
    "phi3 partial rotary": ("phi3-longrope-partial-window", full_rotary),
    "smollm3 NoPE layers": ("smollm3-nope-yarn", every_layer_rotates),
    "smollm3 NoPE layers (second shape)": ("smollm3-gqa3-interval2", every_layer_rotates),
    "llama3 rope scaling": ("llama-gqa3-llama3rope", unscaled_rope),
    "llama3 rope scaling (llama 3.2)": ("llama32-gqa2-tied", unscaled_rope),
    "yarn rope scaling": ("smollm3-nope-yarn", unscaled_rope),
    "longrope rope scaling": ("phi3-longrope-partial-window", unscaled_rope),
    "gemma3 linear rope scaling (global layers)": ("gemma3-gqa4-local-global", unscaled_rope),
    "gemma3 local rotary base": ("gemma3-gqa4-local-global", fields(local_rope=None)),
    "gemma2 norms' +1": ("gemma2-gqa2-softcap", fields(norms_plus_one=False)),
    "gemma3 norms' +1 (q and k norms too)": ("gemma3-gqa4-local-global", fields(norms_plus_one=False)),
    "gemma2 query_pre_attn_scalar": ("gemma2-gqa2-softcap", head_dim_scale),
    "gemma2 query_pre_attn_scalar (second shape)": ("gemma2-gqa4-window3", head_dim_scale),
    "gemma3 query_pre_attn_scalar": ("gemma3-gqa1-pattern2", head_dim_scale),
    "gemma2 global layers": ("gemma2-gqa2-softcap", every_layer_local),
    "gemma3 global layers": ("gemma3-gqa4-local-global", every_layer_local),
    "gemma3 global layers (second shape)": ("gemma3-gqa1-pattern2", every_layer_local),
}


@functools.cache
def tokens(vocab: int) -> tuple[int, ...]:
    return tuple(int(t) for t in np.random.default_rng(PROMPT).integers(0, vocab, PROMPT + DECODE))


def logits(model) -> np.ndarray:
    """[PROMPT + DECODE, vocab]: the prompt's prefill, then each later token decoded."""
    ids = tokens(model.config.vocab_size)
    session = deploycc.reference_session(model)
    out = [session.prefill(ids[:PROMPT], all_logits=True)]
    out += [session.decode(t)[None] for t in ids[PROMPT:]]
    return np.concatenate(out)


@functools.cache
def with_feature(name: str):
    """(the loaded model, its logits); once it matches transformers (test_tiny_logits' comparison)."""
    path = make_tiny(name)
    model = deploycc.load_model(str(path))
    check_logits(load_hf(path), model, "exported", PROMPT)
    return model, logits(model)


@pytest.mark.parametrize("feature", FEATURES)
def test_removing_feature_moves_logits(feature):
    name, remove = FEATURES[feature]
    model, on = with_feature(name)
    off = dataclasses.replace(model, config=remove(model.config), _module=None, _wmap=None)
    moved = float(np.abs(logits(off) - on).max())
    tol = tolerance(on)
    print(f"{feature}: max |logit change| {moved:.3g} = {moved / tol:.0f} x the tolerance {tol:.2g}")
    assert moved >= MARGIN * tol, f"removing {feature} moves the logits by {moved:.3g}, under {MARGIN} x {tol:.2g}"


@pytest.mark.parametrize("name", sorted({**TINY, **WIDE, **SHAPES}))
def test_fixtures_are_sharp(name):
    """Every fixture has a trained model's magnitudes: attention scores of std about SCORE_STD per layer (each
    query's largest weight at least twice a uniform one), logits of std about LOGIT_STD (the final soft-cap off);
    the residual activations that the outlier channels make large stay finite and under 1000."""
    hf = load_hf(make_tiny(name))
    ids = torch.tensor([tokens(hf.config.vocab_size)])
    with torch.no_grad(), _attention_scores(hf) as stds:
        out = hf(ids, output_hidden_states=True, output_attentions=True)
    assert len(stds) == len(out.attentions)
    assert all(SCORE_STD / 2 < s < SCORE_STD * 2 for s in stds), f"attention scores' std per layer {stds}"
    for p in out.attentions:  # p [1, heads, queries, keys]: 0 where masked
        assert (p[0].max(-1).values * (p[0] > 0).sum(-1)).mean() > 2
    logits = out.logits[0]
    assert torch.isfinite(logits).all() and LOGIT_STD / 2 < logits.std(-1).mean() < LOGIT_STD * 2
    assert logits.abs().max() < 10 * LOGIT_STD
    residual = torch.cat(out.hidden_states[1:-1]).abs()  # after each layer but the last (normed there)
    assert torch.isfinite(residual).all() and residual.max() < 1000
