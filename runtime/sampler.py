"""Next-token sampling from one row of logits, with the logit processors of Hugging Face generate.

Order as in transformers: repetition penalty, then temperature, then top-k, then top-p (nucleus).
Temperature 0 means greedy (argmax after the repetition penalty). A seeded numpy Generator makes
sampling reproducible: the same seed, logits and history give the same tokens.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Integral, Real

import numpy as np


def _real(v) -> bool:
    return isinstance(v, Real) and not isinstance(v, bool)


def _integer(v) -> bool:
    return isinstance(v, Integral) and not isinstance(v, bool)


class Sampler:
    def __init__(self, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
                 repetition_penalty: float = 1.0, seed: int = 0):
        if not (_real(temperature) and math.isfinite(temperature) and temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0 (0 means greedy), got {temperature!r}")
        if not (_real(top_p) and 0 < top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
        if not _integer(top_k) or top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 means no top-k filtering), got {top_k!r}")
        if not (_real(repetition_penalty) and math.isfinite(repetition_penalty)
                and repetition_penalty > 0):
            raise ValueError(f"repetition_penalty must be a finite number > 0 (1 means none), got {repetition_penalty!r}")
        if not _integer(seed) or seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.top_k = int(top_k)
        self.repetition_penalty = float(repetition_penalty)
        self.rng = np.random.default_rng(int(seed))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def sample(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        """One token id from logits [vocab]; `history` is the ids the repetition penalty applies to."""
        x = np.asarray(logits).reshape(-1)
        if np.isnan(x).any():
            raise ValueError("logits contain NaN; the model produced invalid output")
        if self.greedy and self.repetition_penalty == 1.0:  # no copy: float32 -> float64 keeps the order exactly
            return int(np.argmax(x))
        x = x.astype(np.float64)  # a copy: the penalty and temperature below write into it
        if self.repetition_penalty != 1.0 and len(history):
            seen = np.unique(np.asarray(history, dtype=np.int64))
            s = x[seen]
            x[seen] = np.where(s < 0, s * self.repetition_penalty, s / self.repetition_penalty)
        if self.greedy:
            return int(np.argmax(x))
        x /= self.temperature
        if 0 < self.top_k < x.size:
            cand = np.argpartition(-x, self.top_k - 1)[:self.top_k]
        else:
            cand = np.arange(x.size)
        cand = cand[np.argsort(-x[cand], kind="stable")]
        if not np.isfinite(x[cand[0]]):
            raise ValueError("logits have no finite maximum; cannot sample")
        p = np.exp(x[cand] - x[cand[0]])
        p /= p.sum()
        if self.top_p < 1.0:
            # Keep the smallest head of the sorted distribution whose mass reaches top_p (at least one token).
            keep = (np.cumsum(p) - p) < self.top_p
            cand, p = cand[keep], p[keep] / p[keep].sum()
        cdf = np.cumsum(p)
        i = int(np.searchsorted(cdf, self.rng.random() * cdf[-1], side="right"))
        return int(cand[min(i, cand.size - 1)])
