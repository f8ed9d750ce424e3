"""Rotary frequencies as Hugging Face computes them (default, linear and Llama-3 scaling)."""
from __future__ import annotations

import math

import numpy as np


def rope_parameters(hf: dict) -> tuple[float, dict | None]:
    """(theta, scaling) from a config dict, in either the transformers 4 (`rope_theta`,
    `rope_scaling`) or the transformers 5 (`rope_parameters`) spelling."""
    params = hf.get("rope_parameters") or {}
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    scaling = hf.get("rope_scaling") or {k: v for k, v in params.items() if k != "rope_theta"}
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    return theta, (None if kind == "default" else dict(scaling, rope_type=kind))


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
