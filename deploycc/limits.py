"""Bounds a compile must meet before anything is exported or written: the context window against
the model's positions, and weights + KV cache + activations against the device's memory.

`deploycc compile` calls `check_compile` right after the model is loaded (its config already checked
against the checkpoint's tensors). Every number here comes from the config and the parameter shapes,
so nothing is allocated: a context window of 10**12 or a model that needs 3x the device's memory is
one line of error instead of a package that cannot load.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np

from .errors import DeployError
from .presets import CONTEXT_WINDOW, Preset

FLOAT = 4  # KV cache and activations are float32


@dataclass(frozen=True)
class Footprint:
    weights: int
    kv_cache: int
    activations: int  # an upper estimate: the largest prefill step's live tensors, without plan reuse

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.activations


def context_window(model, preset: Preset, requested: int | None) -> tuple[int, int]:
    """(context window, prefill chunk) of a compile, as compile_model chooses them, the requested
    window checked against the model's positions."""
    cfg = model.config
    limit = getattr(cfg, "max_context_window", None)
    if requested is not None:
        if isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
            raise DeployError(f"--context-window must be a positive integer, got {requested!r}")
        if limit is not None and requested > limit:
            key = "n_positions" if hasattr(cfg, "n_positions") else "max_position_embeddings"
            raise DeployError(f"--context-window {requested} exceeds the {limit} positions this model was trained for "
                              f"({key} in its config); use --context-window {min(limit, CONTEXT_WINDOW[1])} or less")
        if requested > CONTEXT_WINDOW[1]:
            raise DeployError(f"--context-window {requested} is more than {CONTEXT_WINDOW[1]} tokens; choose a smaller one")
    ctx = requested or min(preset.context_window, cfg.context_window)
    return ctx, max(1, min(preset.prefill_chunk, ctx))


def _dims(cfg) -> tuple[int, int, int, int]:
    """(hidden, intermediate, attention heads, vocabulary) under either spelling (Llama or GPT-2)."""
    hidden = getattr(cfg, "hidden_size", None) or cfg.n_embd
    inter = getattr(cfg, "intermediate_size", None) or cfg.n_inner
    heads = getattr(cfg, "num_attention_heads", None) or cfg.n_head
    return hidden, inter, heads, cfg.vocab_size


def weight_bytes(model) -> int:
    """Bytes of every parameter as the package stores it (packed, after quantization), from shapes alone."""
    return sum(math.prod(p.shape) * np.dtype(p.dtype).itemsize for _, p in model.build().named_parameters())


def footprint(cfg, weights: int, ctx: int, chunk: int, kv_bytes: int = FLOAT) -> Footprint:
    """Bytes of the package at run time with this context window and prefill chunk (nothing allocated); kv_bytes:
    of a cached element (the preset's kv_cache: float32 4, float16 2)."""
    kv = 2 * sum(kv_rows(cfg, layer, ctx, chunk) for layer in range(cfg.num_hidden_layers)) \
        * cfg.num_key_value_heads * cfg.head_dim * kv_bytes
    hidden, inter, heads, vocab = _dims(cfg)
    # One prefill step of `chunk` tokens: every position's logits (prefill_all), the attention scores
    # against the whole cache, the MLP's gate/up/product and a few residual-width tensors.
    acts = FLOAT * chunk * (vocab + heads * ctx + 3 * inter + 6 * hidden + 3 * heads * cfg.head_dim)
    return Footprint(weights, kv, acts)


def kv_rows(cfg, layer: int, ctx: int, chunk: int) -> int:
    """The KV-cache rows a layer keeps: a sliding-window layer's ring (nn.core.ring_rows), else the context window."""
    from .nn.core import ring_rows

    return ring_rows(cfg.window(layer) if hasattr(cfg, "window") else 0, chunk, ctx) or ctx


def device_memory(preset: Preset) -> tuple[int | None, str]:
    """(bytes, what they are): the preset's memory_bytes, or this machine's RAM for a preset without one
    (CPU presets: the package runs where it is compiled); None where the RAM cannot be read."""
    if preset.target.memory_bytes:
        return preset.target.memory_bytes, f"device memory of preset {preset.name} (target.memory_bytes)"
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not a POSIX system that reports it
        return None, ""
    return (ram if ram > 0 else None), "RAM of this machine"


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def check_memory(model, preset: Preset, ctx: int, chunk: int) -> Footprint:
    cfg, weights = model.config, weight_bytes(model)
    kv_bytes = np.dtype(preset.kv_cache).itemsize
    need = footprint(cfg, weights, ctx, chunk, kv_bytes)
    have, what = device_memory(preset)
    if have is None or need.total <= have:
        return need

    def fits(c: int) -> bool:
        return footprint(cfg, weights, c, min(preset.prefill_chunk, c), kv_bytes).total <= have

    if fits(1):  # the footprint grows with the window: the largest window that fits, by bisection
        lo, hi = 1, ctx - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
        hint = f"use --context-window {lo} or less, or a smaller --quantization (q4f16_1)"
    else:
        hint = "the weights alone do not fit: use a smaller --quantization (q4f16_1) or a preset with more memory"
    raise DeployError(f"the package needs {_size(need.total)} (weights {_size(need.weights)}, KV cache "
                      f"{_size(need.kv_cache)} for a context window of {ctx}, activations about {_size(need.activations)}), "
                      f"more than the {_size(have)} {what}; {hint}")


def check_compile(model, preset: Preset, requested_context: int | None) -> tuple[int, int]:
    """(context window, prefill chunk) once both fit the model and the device; DeployError otherwise."""
    ctx, chunk = context_window(model, preset, requested_context)
    check_memory(model, preset, ctx, chunk)
    return ctx, chunk
