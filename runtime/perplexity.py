"""Perplexity of a session on token ids: the llama-perplexity of this tool.

Sliding windows as in Hugging Face's perplexity recipe ("Perplexity of fixed-length models"):
windows of `window` tokens start every `stride` tokens; each window is one fresh prefill with all
logits, and scores only the tokens that no earlier window scored, so every token after the first
is predicted exactly once, with up to `window - stride` tokens of extra context. The result is
exp(mean negative log-likelihood), computed in float64 from float32 logits.

Numpy only and no relative imports: the package runtime uses it, and benchmarks/compare.py loads this
file by path into peers' interpreters (llama-cpp-python's venv) so every tool is scored by this code.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np


class PerplexityError(ValueError):
    pass


@dataclass(frozen=True)
class Perplexity:
    perplexity: float
    mean_nll: float
    tokens_scored: int
    windows: int
    window: int
    stride: int

    def to_dict(self) -> dict:
        return asdict(self)


def nll_of_targets(logits: np.ndarray, targets: Sequence[int]) -> np.ndarray:
    """-log softmax(logits[i])[targets[i]] per row, in float64."""
    x = np.asarray(logits).astype(np.float64)
    top = x.max(axis=-1, keepdims=True)
    logz = np.log(np.exp(x - top).sum(axis=-1)) + top[:, 0]
    return logz - x[np.arange(len(targets)), np.asarray(targets)]


def windows(n: int, window: int = 512, stride: int = 512) -> list[tuple[int, int, int]]:
    """(begin, end, first) per window: one fresh prefill of ids[begin:end] that scores ids[first:end]
    (row i of its logits predicts ids[begin + i + 1]); token 0 has no prediction."""
    if n < 2:
        raise PerplexityError("perplexity needs a text of at least two tokens")
    if not 1 <= stride <= window:
        raise PerplexityError(f"--stride {stride} must be between 1 and --window {window}")
    out, scored_to = [], 1
    for begin in range(0, n, stride):
        end = min(begin + window, n)
        if end <= scored_to:
            break
        out.append((begin, end, max(scored_to, begin + 1)))
        scored_to = end
        if end == n:
            break
    return out


def perplexity(session, ids: Sequence[int], window: int = 512, stride: int = 512) -> Perplexity:
    """`session` has the session contract (`prefill(ids, all_logits=True)`, `reset()`, optionally
    `context_window`)."""
    ids = [int(i) for i in ids]
    wins = windows(len(ids), window, stride)
    limit = getattr(session, "context_window", None)
    if limit is not None and window > limit:
        raise PerplexityError(f"--window {window} exceeds the package's context window of {limit}")
    nll = []
    for begin, end, first in wins:
        session.reset()
        logits = session.prefill(ids[begin:end], all_logits=True)
        nll.append(nll_of_targets(logits[first - 1 - begin:end - 1 - begin], ids[first:end]))
    session.reset()
    all_nll = np.concatenate(nll)
    mean = float(all_nll.mean())
    return Perplexity(float(np.exp(mean)), mean, int(all_nll.size), len(wins), window, stride)
