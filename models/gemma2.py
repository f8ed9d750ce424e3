"""Gemma 2: local (sliding-window) and global layers alternating, attention scores capped at
attn_logit_softcapping and logits at final_logit_softcapping. The layers are models/gemma.py's."""
from __future__ import annotations

from .gemma import LAYERS, GemmaConfig, GemmaForCausalLM, shape_facts, weight_map  # noqa: F401

Config = GemmaConfig  # its defaults are Gemma 2's (PATTERN 2: local, global, local, ...)
Model = GemmaForCausalLM
