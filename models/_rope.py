"""Rotary frequencies as Hugging Face computes them (default, linear and Llama-3 scaling)."""
from __future__ import annotations

import math

import numpy as np

from ._config import check_positive

# The scaling types inv_freq implements, and the numbers each needs.
SCALING_KEYS = {"linear": ("factor",),
                "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}


def rope_parameters(hf: dict) -> tuple[float, dict | None]:
    """(theta, scaling) from a config dict, in either the transformers 4 (`rope_theta`,
    `rope_scaling`) or the transformers 5 (`rope_parameters`) spelling; checked here, while the
    config is read, so that a bad value names its key instead of failing inside inv_freq."""
    params = hf.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise ValueError(f"rope_parameters must be a mapping, got {params!r}")
    theta = params.get("rope_theta", hf.get("rope_theta"))
    theta = check_positive("rope_theta", 10000.0 if theta is None else theta)
    scaling = hf.get("rope_scaling") or {k: v for k, v in params.items() if k != "rope_theta"}
    if not isinstance(scaling, dict):
        raise ValueError(f"rope_scaling must be a mapping or null, got {scaling!r}")
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return theta, None
    if not isinstance(kind, str) or kind not in SCALING_KEYS:
        raise ValueError(f"unsupported rope_scaling type {kind!r} (supported: default, {', '.join(SCALING_KEYS)})")
    for key in SCALING_KEYS[kind]:
        if key not in scaling:
            raise ValueError(f"rope_scaling of type {kind} lacks {key!r}")
        check_positive(f"rope_scaling.{key}", scaling[key])
    if kind == "llama3" and not scaling["low_freq_factor"] < scaling["high_freq_factor"]:
        raise ValueError("rope_scaling.low_freq_factor must be smaller than high_freq_factor")
    return theta, dict(scaling, rope_type=kind)


def inv_freq(head_dim: int, theta: float, scaling: dict | None) -> np.ndarray:
    # HF: 1 / base ** (arange(0, dim, 2).float() / dim), in float32.
    exps = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    freq = (1.0 / (np.float32(theta) ** exps)).astype(np.float32)
    if scaling is None:
        return freq
    kind = scaling["rope_type"]
    if kind == "linear":
        return (freq / np.float32(scaling["factor"])).astype(np.float32)
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
        return np.where(medium, smoothed, out).astype(np.float32)
    raise ValueError(f"unsupported rope_scaling type {kind!r} (supported: default, linear, llama3)")
