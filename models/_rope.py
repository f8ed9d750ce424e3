"""Rotary frequencies as Hugging Face computes them: default, linear, Llama 3, YaRN and LongRoPE scaling,
over all of head_dim or its first `partial_rotary_factor` part.

`Rope` holds one rotary embedding's numbers, read and checked while the config is read (so that a bad
value names its key); `frequencies(context)` gives the inverse frequencies and the attention factor
(YaRN's and LongRoPE's scaling of cos and sin) for a model compiled with that context window.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np

from ._config import check_positive

# The scaling types Rope implements, and the numbers each needs.
SCALING_KEYS = {"linear": ("factor",),
                "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
                "yarn": ("factor",),
                "longrope": ("short_factor", "long_factor")}
ALIASES = {"su": "longrope"}  # Phi-3's first configs


@dataclass(frozen=True)
class Rope:
    theta: float
    scaling: dict | None  # None: no scaling; else its rope_type and numbers
    dim: int  # the rotated dimensions: head_dim, or its partial_rotary_factor part
    max_position_embeddings: int

    def __hash__(self) -> int:  # by its numbers: `scaling` holds a dict (and LongRoPE's lists)
        return hash(repr(self))

    def frequencies(self, context: int) -> tuple[np.ndarray, float]:
        """(inv_freq [dim / 2] float32, attention factor) for a cache of `context` positions; one array per
        rotation and context, so that every function of a module shares the constant."""
        longrope = self.scaling is not None and self.scaling["rope_type"] == "longrope"
        return _frequencies(self, context if longrope else 0)


@functools.cache
def _frequencies(rope: Rope, context: int) -> tuple[np.ndarray, float]:
    return inv_freq(rope.dim, rope.theta, rope.scaling, rope.max_position_embeddings, context)


def rope_parameters(hf: dict, layer_type: str = "full_attention") -> tuple[float, dict | None]:
    """(theta, scaling) from a config dict, in either the transformers 4 (`rope_theta`,
    `rope_scaling`) or the transformers 5 (`rope_parameters`) spelling. Where rope_parameters is given
    per layer type (Gemma 3's `full_attention` and `sliding_attention`), `layer_type`'s: the global
    layers' by default, the model's rotation."""
    params = hf.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise ValueError(f"rope_parameters must be a mapping, got {params!r}")
    nested = isinstance(params.get(layer_type), dict)
    if nested:
        params = params[layer_type]
    theta = params.get("rope_theta", None if nested else hf.get("rope_theta"))
    theta = check_positive("rope_theta", 10000.0 if theta is None else theta)
    scaling = (None if nested else hf.get("rope_scaling")) or {
        k: v for k, v in params.items() if k not in ("rope_theta", "partial_rotary_factor")}
    return theta, check_scaling(scaling, hf)


def check_scaling(scaling, hf: dict) -> dict | None:
    if not isinstance(scaling, dict):
        raise ValueError(f"rope_scaling must be a mapping or null, got {scaling!r}")
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    kind = ALIASES.get(kind, kind)
    if kind == "default":
        return None
    if not isinstance(kind, str) or kind not in SCALING_KEYS:
        raise ValueError(f"unsupported rope_scaling type {kind!r} (supported: default, {', '.join(SCALING_KEYS)})")
    scaling = dict(scaling, rope_type=kind)
    if "original_max_position_embeddings" not in scaling and kind in ("yarn", "longrope"):
        scaling["original_max_position_embeddings"] = hf.get("original_max_position_embeddings",
                                                            hf.get("max_position_embeddings"))
    for key in SCALING_KEYS[kind] + (("original_max_position_embeddings",) if kind in ("yarn", "longrope") else ()):
        if scaling.get(key) is None:
            raise ValueError(f"rope_scaling of type {kind} lacks {key!r}")
        if key.endswith("_factor") and kind == "longrope":
            v = scaling[key]
            if not isinstance(v, list) or not v:
                raise ValueError(f"rope_scaling.{key} must be a list of numbers, got {str(v)[:60]}")
            for x in v:
                check_positive(f"rope_scaling.{key}", x)
        else:
            check_positive(f"rope_scaling.{key}", scaling[key])
    for key in ("attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim"):
        if scaling.get(key) is not None:
            check_positive(f"rope_scaling.{key}", scaling[key])
    if kind == "llama3" and not scaling["low_freq_factor"] < scaling["high_freq_factor"]:
        raise ValueError("rope_scaling.low_freq_factor must be smaller than high_freq_factor")
    return scaling


def rotary_dim(hf: dict, head_dim: int) -> int:
    """The dimensions rotary embedding rotates: int(head_dim * partial_rotary_factor), even."""
    params = hf.get("rope_parameters") if isinstance(hf.get("rope_parameters"), dict) else {}
    factor = params.get("partial_rotary_factor", hf.get("partial_rotary_factor"))
    factor = 1.0 if factor is None else check_positive("partial_rotary_factor", factor, hi=1.0)
    dim = int(head_dim * factor)
    if dim < 2 or dim % 2:
        raise ValueError(f"partial_rotary_factor {factor} rotates {dim} of head_dim {head_dim}; "
                         f"it must rotate an even number of dimensions, at least 2")
    return dim


def has_layer_rope(hf: dict, layer_type: str) -> bool:
    """Whether config.json's rope_parameters has an entry for `layer_type` (transformers 5's Gemma 3)."""
    params = hf.get("rope_parameters")
    return isinstance(params, dict) and isinstance(params.get(layer_type), dict)


def rope_of(hf: dict, head_dim: int, max_positions: int, layer_type: str = "full_attention") -> Rope:
    theta, scaling = rope_parameters(hf, layer_type)
    dim = rotary_dim(hf, head_dim)
    if scaling is not None and scaling["rope_type"] == "longrope":
        for key in ("short_factor", "long_factor"):
            if len(scaling[key]) != dim // 2:
                raise ValueError(f"rope_scaling.{key} has {len(scaling[key])} numbers; "
                                 f"the {dim} rotated dimensions need {dim // 2}")
    return Rope(theta, scaling, dim, max_positions)


def _base_freq(dim: int, theta: float) -> np.ndarray:
    # HF: 1 / base ** (arange(0, dim, 2).float() / dim), in float32.
    exps = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    return (np.float32(theta) ** exps).astype(np.float32)


def inv_freq(dim: int, theta: float, scaling: dict | None, max_positions: int = 0,
             context: int = 0) -> tuple[np.ndarray, float]:
    pos = _base_freq(dim, theta)
    freq = (1.0 / pos).astype(np.float32)
    if scaling is None:
        return freq, 1.0
    kind = scaling["rope_type"]
    if kind == "linear":
        return (freq / np.float32(scaling["factor"])).astype(np.float32), 1.0
    if kind == "llama3":
        factor = scaling["factor"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        old = scaling["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old / low, old / high
        wavelen = 2 * math.pi / freq
        out = np.where(wavelen > low_wavelen, freq / factor, freq)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * out / factor + smooth * out
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return np.where(medium, smoothed, out).astype(np.float32), 1.0
    old = scaling["original_max_position_embeddings"]
    if kind == "yarn":
        return _yarn(dim, theta, scaling, pos, freq, old)
    if kind == "longrope":
        # HF switches to the long factors once a sequence passes the original length; a compiled model
        # has one table, so the context window decides: the long factors where it exceeds that length.
        factor = scaling.get("factor") or max_positions / old
        attention = scaling.get("attention_factor")
        if attention is None:
            attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(old))
        ext = np.asarray(scaling["long_factor" if context > old else "short_factor"], np.float32)
        return (1.0 / (ext * pos)).astype(np.float32), float(attention)
    raise ValueError(f"unsupported rope_scaling type {kind!r}")


def _yarn(dim: int, theta: float, scaling: dict, pos: np.ndarray, freq: np.ndarray, old: int):
    """YaRN (arXiv:2309.00071): interpolate the low frequencies, keep the high ones, ramp between."""
    factor = scaling["factor"]

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = scaling.get("attention_factor")
    if attention is None:
        m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    fast, slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def correction_dim(rotations):
        return dim * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(fast), correction_dim(slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low), 0, 1)
    extrapolate = (1 - ramp).astype(np.float32)
    interpolated = (1.0 / (np.float32(factor) * pos)).astype(np.float32)
    return (interpolated * (1 - extrapolate) + freq * extrapolate).astype(np.float32), float(attention)
