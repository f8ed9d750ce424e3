"""calibrate: which linears of an integer package take 16-bit activations (issue 25, item 5).

The cpu target's integer matmuls round each block of 32 inputs to 8 bits at a scale set by the block's largest
entry (op/linalg.py round_activations). Real models have a few input channels tens to hundreds of times the rest
at some linears (the down projections of some layers above all): there a block keeps its outlier and loses the
other 31 entries, and the error is not the 0.4% of a typical block but tens of per cent. A fixed 8-bit choice is
then a latent bug on the models users deploy (SmolLM2's demo answer degenerates; onnxruntime issue 29849 is the
same failure on Qwen3 and Phi-3.5).

So compile measures, on a short text that ships with deploycc (data/calibration.txt: public-domain prose, our
own prose, questions and code), what 8-bit activations cost each linear against float activations,

    cost(W) = ||W (r8(x) - x)|| / ||W x||        over every calibration token, every other linear in float,

(the linear's own relative output error, so one linear's cost does not depend on which others round), and gives
16 bits (int16 codes: vpmaddwd / vpdpwssd, targets/c_intrin.py) to every linear whose cost exceeds THRESHOLD.
The reference interpreter runs the calibration: the graph's round_activations ops, which name the module they
serve (attr weight), are intercepted, so the measure is of the package's own graph.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

CALIBRATION = Path(__file__).with_name("data") / "calibration.txt"
# Chosen by measurement on SmolLM2-135M-Instruct (README "Activation precision", benchmarks/agreement.py: 100
# everyday chat prompts, float32 transformers' first 32 greedy tokens kept whole): its linears cost 0.05% to 2.9%
# each (median 0.76%), and the answers are decided not by a few of them but by the sum: 16 bits on the 6 costliest
# kept 48% of the prompts, on the 94 above 0.8% 67%, on the 180 above 0.6% 84%, on all but the output head 72%,
# on all 211 99% (8 bits everywhere: 39%). So 8 bits stay only where they cost next to nothing (an input of few
# distinct magnitudes), which no SmolLM2 linear does.
THRESHOLD = 0.0002
SEGMENT = 256  # tokens per prefill: the calibration text in independent pieces (a small KV cache)
MAX_TOKENS = 1024
STRIDE = 4  # tokens of which one is measured


@dataclass
class Costs:
    """Accumulated squared norms per module: cost = sqrt(err / out)."""

    err: dict = field(default_factory=lambda: defaultdict(float))
    out: dict = field(default_factory=lambda: defaultdict(float))
    pending: dict = field(default_factory=dict)

    def rounding(self, x, bits, weight=""):
        """round_activations, intercepted: the float input goes on (a copy, so each linear's input is its own
        object), with what 8-bit rounding would change in it, for the linear that reads it."""
        x = np.asarray(x, np.float32)
        out = x.copy()
        from .op.linalg import round_activations_np

        self.pending[id(out)] = (weight, round_activations_np(x, 8) - x, out)
        return out

    def linear(self, x, w, b=None):
        hit = self.pending.pop(id(x), None)
        y = np.matmul(x, w.T)
        if hit is not None and hit[2] is x:  # every STRIDE-th token's error: the measure, at a fraction of the cost
            name, delta, _ = hit
            rows = (slice(None),) * (x.ndim - 2) + (slice(None, None, STRIDE),)
            self.err[name] += float(np.square(np.matmul(delta[rows], w.T), dtype=np.float64).sum())
            self.out[name] += float(np.square(y[rows], dtype=np.float64).sum())
        return (y if b is None else y + b).astype(x.dtype)

    def result(self) -> dict[str, float]:
        return {n: float(np.sqrt(self.err[n] / self.out[n])) if self.out[n] > 0 else 0.0 for n in self.err}


def calibration_ids(model, limit: int = MAX_TOKENS) -> list[int]:
    """The calibration text as the model's tokens (its tokenizer.json; without one, the text's bytes modulo the
    vocabulary, which still exercises every linear with realistic activations of the model's embeddings)."""
    text = CALIBRATION.read_text()
    vocab = model.config.vocab_size
    path = Path(getattr(model, "path", "") or "")
    if (path / "tokenizer.json").exists():
        from .runtime.tokenizer import Tokenizer

        ids = Tokenizer.from_dir(path, vocab_size=vocab).encode(text)
    else:
        ids = [b % vocab for b in text.encode()]
    return ids[:limit]


def activation_costs(model, ids: list[int] | None = None, progress=None) -> dict[str, float]:
    """{module name: cost} for every linear `model` marks as rounding its input (quantization.mark_activations),
    over `ids` (the calibration text by default) in prefills of SEGMENT tokens."""
    from .session import ReferenceSession

    ids = calibration_ids(model) if ids is None else ids
    costs = Costs()
    ctx = min(SEGMENT, model.config.context_window)
    session = ReferenceSession(model, context_window=ctx, ops={"round_activations": costs.rounding,
                                                               "linear": costs.linear})
    pieces = [ids[i:i + ctx] for i in range(0, len(ids), ctx)]
    for i, piece in enumerate(pieces):
        session.reset()
        session.prefill(piece)
        if progress:
            progress(i + 1, len(pieces))
    return costs.result()


def choose(costs: dict[str, float], threshold: float = THRESHOLD) -> dict[str, int]:
    """{module name: bits}: 16 where 8-bit activations cost more than `threshold`, else 8."""
    return {name: 16 if cost > threshold else 8 for name, cost in costs.items()}
