"""Strict reading of config.json values: what a Config dataclass may hold.

A hostile or damaged config must not become a fractional head count or a zero-length context. Each
reader takes the value the Hugging Face key holds, checks its type (a bool is not an integer here, nor
is 2.0 or "2") and its range, and raises ValueError with a message that names the key; the loader
turns that into a DeployError naming the file. Sizes are then checked against the tensors present
(deploycc.hub.check_config) before the model is built, so 10**9 layers never become 10**9 modules.
"""
from __future__ import annotations

import math

_MISSING = object()

# The largest value a key may hold: where no tensor bounds a size before the model is built (head_dim
# sizes the rotary table of every layer; positions bound the context window), a generous limit well
# above any released model; every other size is checked against the tensors (deploycc.hub.check_config)
# and needs only to fit the int32 indices of the kernels.
LIMITS = {"head_dim": 1 << 12, "max_position_embeddings": 1 << 24, "n_positions": 1 << 24, "context_window": 1 << 24}
INDEX_LIMIT = (1 << 31) - 1


def value(hf: dict, key: str, default=_MISSING):
    """hf[key], or `default` where the key is absent or null (KeyError when there is no default)."""
    v = hf.get(key)
    if v is None:
        if default is _MISSING:
            raise KeyError(key)
        return default
    return v


def count(hf: dict, key: str, default=_MISSING) -> int:
    """A positive integer no larger than LIMITS[key]."""
    return check_count(key, value(hf, key, default))


def check_count(key: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{key} must be a positive integer, got {v!r}")
    hi = LIMITS.get(key, INDEX_LIMIT)
    if not 1 <= v <= hi:
        raise ValueError(f"{key} is {v}; it must be between 1 and {hi}")
    return v


def positive(hf: dict, key: str, default: float, hi: float = 1e12) -> float:
    """A positive finite number (epsilons, rotary bases, scaling factors) no larger than `hi`."""
    return check_positive(key, value(hf, key, default), hi)


def check_positive(key: str, v, hi: float = 1e12) -> float:
    # The upper bound keeps the value a finite float32 (the kernels' type) with room to spare.
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not 0 < v <= hi:
        raise ValueError(f"{key} must be a positive number of at most {hi:g}, got {v!r}")
    return float(v)


def flag(hf: dict, key: str, default: bool) -> bool:
    v = value(hf, key, default)
    if not isinstance(v, bool):
        raise ValueError(f"{key} must be true or false, got {v!r}")
    return v


def text(hf: dict, key: str, default: str) -> str:
    v = value(hf, key, default)
    if not isinstance(v, str):
        raise ValueError(f"{key} must be a string, got {v!r}")
    return v


def apply_overrides(cfg, overrides: dict) -> None:
    """Loader overrides (context_window=...): known fields only, sizes checked like config values."""
    for k, v in overrides.items():
        if not hasattr(cfg, k):
            raise ValueError(f"unknown config override {k!r}")
        current = getattr(cfg, k)
        if isinstance(current, int) and not isinstance(current, bool):
            v = check_count(k, v)
        setattr(cfg, k, v)
