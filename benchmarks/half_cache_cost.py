"""What a float16 KV cache costs a model's logits (the GPU presets' `kv_cache: float16`): the numpy reference with a
float16 cache against the same with float32, prompts of 7, 33 and 120 random tokens, each followed by 8 greedy decode
steps on the float32 reference's tokens. Printed per prompt: the largest logit difference, the 90th percentile of the
positions' relative RMS difference, and the top-1 agreement. No GPU needed (about 2 minutes for SmolLM2-135M).

    .venv/bin/python benchmarks/half_cache_cost.py [MODEL] [--quantization q4f16_1]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default=str(Path.home() / ".cache/deploycc/models/SmolLM2-135M-Instruct"))
    ap.add_argument("--quantization", default="q4f16_1")
    args = ap.parse_args()
    import deploycc

    model = deploycc.load_model(args.model)
    refs = {kv: deploycc.reference_session(model, context_window=256, quantization=args.quantization, kv_cache=kv)
            for kv in ("float32", "float16")}
    rng = np.random.default_rng(0)
    for n in (7, 33, 120):
        ids = [int(t) for t in rng.integers(0, model.config.vocab_size, n)]
        tokens: list[int] = []
        out = {}
        for kv, ref in refs.items():  # float32 first: its greedy tokens are both sides' decode inputs
            ref.reset()
            logits = [ref.prefill(ids, all_logits=True)]
            for s in range(8):
                if kv == "float32":
                    tokens.append(int(np.argmax(logits[-1][-1])))
                logits.append(ref.decode(tokens[s])[None])
            out[kv] = np.concatenate(logits)
        half, full = out["float16"], out["float32"]
        rel = np.sqrt(((half - full) ** 2).mean(-1)) / np.sqrt((full ** 2).mean(-1))
        print(f"prompt {n:4d}: largest |difference| {np.abs(half - full).max():.4f}, relative RMS (p90) "
              f"{np.percentile(rel, 90):.2e}, top-1 agreement {(half.argmax(-1) == full.argmax(-1)).mean():.0%}")


if __name__ == "__main__":
    main()
