"""Write a synthetic ~1B-parameter Llama checkpoint (random float16 weights) for measuring the
streaming weight conversion of `deploycc compile` (peak RSS), one safetensors shard per layer group.

    python scripts/make_synthetic_llama.py OUT_DIR [--layers 20]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

CONFIG = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=32000, hidden_size=2048,
              intermediate_size=5632, num_attention_heads=32, num_key_value_heads=4, rms_norm_eps=1e-5,
              rope_theta=10000.0, max_position_embeddings=2048, tie_word_embeddings=False, torch_dtype="float16")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--layers", type=int, default=20)
    args = ap.parse_args()
    cfg = dict(CONFIG, num_hidden_layers=args.layers)
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    kv = h // cfg["num_attention_heads"] * cfg["num_key_value_heads"]
    rng = np.random.default_rng(0)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)

    def w(*shape):
        return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)

    index, total = {}, 0
    shards = [{"model.embed_tokens.weight": w(v, h), "model.norm.weight": np.ones(h, np.float16),
               "lm_head.weight": w(v, h)}]
    for layer in range(args.layers):
        p = f"model.layers.{layer}."
        shards.append({p + "self_attn.q_proj.weight": w(h, h), p + "self_attn.k_proj.weight": w(kv, h),
                       p + "self_attn.v_proj.weight": w(kv, h), p + "self_attn.o_proj.weight": w(h, h),
                       p + "mlp.gate_proj.weight": w(i, h), p + "mlp.up_proj.weight": w(i, h),
                       p + "mlp.down_proj.weight": w(h, i), p + "input_layernorm.weight": np.ones(h, np.float16),
                       p + "post_attention_layernorm.weight": np.ones(h, np.float16)})
    for n, shard in enumerate(shards):
        name = f"model-{n + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / name))
        for k, a in shard.items():
            index[k] = name
            total += a.size
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total * 2},
                                                                    "weight_map": index}))
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    print(f"{out}: {total / 1e9:.2f}B parameters")


if __name__ == "__main__":
    main()
