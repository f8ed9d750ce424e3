"""Perplexity of a package (or any session) on a text: the llama-perplexity of this tool.

Sliding windows as in Hugging Face's perplexity recipe ("Perplexity of fixed-length models"):
windows of `window` tokens start every `stride` tokens; each window is one fresh prefill with all
logits, and scores only the tokens that no earlier window scored, so every token after the first
is predicted exactly once, with up to `window - stride` tokens of extra context. The result is
exp(mean negative log-likelihood), computed in float64 from float32 logits.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from .errors import DeployError


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
    x = logits.astype(np.float64)
    top = x.max(axis=-1, keepdims=True)
    logz = np.log(np.exp(x - top).sum(axis=-1)) + top[:, 0]
    return logz - x[np.arange(len(targets)), np.asarray(targets)]


def perplexity(session, ids: Sequence[int], window: int = 512, stride: int = 512) -> Perplexity:
    """`session` has the session contract (`prefill(ids, all_logits=True)`, `reset()`)."""
    ids = [int(i) for i in ids]
    if len(ids) < 2:
        raise DeployError("perplexity needs a text of at least two tokens")
    if not 1 <= stride <= window:
        raise DeployError(f"--stride {stride} must be between 1 and --window {window}")
    limit = getattr(session, "context_window", None)
    if limit is not None and window > limit:
        raise DeployError(f"--window {window} exceeds the package's context window of {limit}")
    nll, scored_to, windows = [], 1, 0  # token 0 has no prediction
    for begin in range(0, len(ids), stride):
        end = min(begin + window, len(ids))
        if end <= scored_to:
            break
        session.reset()
        logits = session.prefill(ids[begin:end], all_logits=True)  # row i predicts ids[begin + i + 1]
        first = max(scored_to, begin + 1)
        nll.append(nll_of_targets(logits[first - 1 - begin:end - 1 - begin], ids[first:end]))
        scored_to, windows = end, windows + 1
        if end == len(ids):
            break
    session.reset()
    all_nll = np.concatenate(nll)
    mean = float(all_nll.mean())
    return Perplexity(float(np.exp(mean)), mean, int(all_nll.size), windows, window, stride)


def package_perplexity(package, text: str, window: int = 512, stride: int = 512, device: str | None = None
                       ) -> Perplexity:
    """Tokenise `text` with the package's tokenizer (special tokens as the tokenizer adds them, as
    the recipe does) and measure perplexity with the package's engine."""
    from .runtime.engine import Engine

    engine = Engine.load(package, device=device)
    return perplexity(engine, engine.tokenizer.encode(text), window, stride)
