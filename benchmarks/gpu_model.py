"""The performance model's predictions (deploycc/perfmodel.py) for four model shapes on the h100 and rtx4090 presets,
as a table: decode tok/s after `--context` tokens and its fraction of the HBM roofline, prefill tok/s of `--prefill`
tokens, launches per step, and whether the device or the host bounds the decode step. No GPU needed.

A model's layers are alike, so each shape is compiled with 1 and with 2 layers (random weights by transformers, the
real vocabulary and widths) and a step of L layers is T(1) + (T(2) - T(1)) x (L - 1), for the device's time, the
host's, the bytes and the FLOPs alike: an 8B model needs no 16 GB checkpoint.

    .venv/bin/python benchmarks/gpu_model.py [--context 512] [--prefill 512] [--sequences 1,4,16] [--json]
        [--shapes SmolLM2-135M-shaped,...] [--presets h100,rtx4090] [--no-graphs] [--activations auto|8]

With --sequences, also the server's batched step over the page pool (one token for each of B sequences after
`--context` tokens each): its aggregate tok/s per B.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import build_llama_cpp as b  # noqa: E402

SHAPES = {**b.SHAPES,
          "Llama-3.1-8B-shaped": {
              "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
              "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
              "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256, "max_position_embeddings": 8192,
              "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "hidden_act": "silu"}}
ORDER = ["SmolLM2-135M-shaped", "Qwen2.5-0.5B-shaped", "Llama-3.2-1B-shaped", "Llama-3.1-8B-shaped"]
PRESETS = ("h100", "rtx4090")


def root() -> Path:
    return Path(os.environ.get("DEPLOYCC_HOME") or Path.home() / ".cache" / "deploycc") / "bench" / "gpu_model"


def checkpoint(shape: str, layers: int) -> Path:
    """SHAPES[shape] with `layers` layers, random (seed 0), with SmolLM2's tokenizer files."""
    out = root() / "models" / f"{shape}-{layers}L"
    if not (out / "config.json").exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        b.random_checkpoint({**SHAPES[shape], "num_hidden_layers": layers}, out, b.checkpoint_dir())
    return out


def package(shape: str, layers: int, preset: str, activations: str = "auto") -> Path:
    """The shape's package, compiled once. activations "8": every linear's input rounded to 8 bits where the preset's
    kernels round (h100's dp4a GEMV; compile's --activations 8), else compile's default (float on cuda)."""
    from deploycc import presets
    from deploycc.package import compile_model

    rounds = activations != "auto" and presets.load(preset).target.integer_kernels
    out = root() / "packages" / f"{shape}-{layers}L-{preset}{'-a' + activations if rounds else ''}"
    if (out / "manifest.json").exists():
        return out
    shutil.rmtree(out, ignore_errors=True)
    return compile_model(str(checkpoint(shape, layers)), preset, quantization="q4f16_1", out=str(out),
                         activations=activations if rounds else "auto")


def step_totals(pred: dict, fname: str) -> dict:
    s = pred["steps"][fname]
    return {"device_s": s.device_s, "host_s": s.host_s, "bytes": s.bytes, "flops": s.flops,
            "launches": len(s.launches), "tokens": s.tokens}


def extrapolate(one: dict, two: dict, layers: int) -> dict:
    return {k: one[k] + (two[k] - one[k]) * (layers - 1) if k != "tokens" else one[k] for k in one}


def predict_shape(shape: str, preset: str, context: int, prefill: int, sequences: tuple[int, ...] = (),
                  graphs: bool = True, activations: str = "auto") -> dict:
    from deploycc import presets
    from deploycc.perfmodel import predict

    layers = SHAPES[shape]["num_hidden_layers"]
    preds = [predict(package(shape, n, preset, activations), context=context, prefill=prefill, sequences=sequences, graphs=graphs)
             for n in (1, 2)]
    steps = {}
    for fname in ("decode", "prefill", *(f"step{n}" for n in sequences)):
        steps[fname] = extrapolate(*(step_totals(pred, fname) for pred in preds), layers)
    hw = presets.load(preset).hardware
    d, p = steps["decode"], steps["prefill"]
    step = max(d["device_s"], d["host_s"])
    roof = d["bytes"] / (hw["bandwidth_gb_s"] * 1e9)
    return {"shape": shape, "preset": preset, "layers": layers, "context": context,
            "decode_tok_s": 1 / step, "decode_roofline_fraction": roof / step, "roofline_tok_s": 1 / roof,
            "decode_launches": d["launches"], "decode_bound": "host" if d["host_s"] > d["device_s"] else "device",
            "decode_device_ms": d["device_s"] * 1e3, "decode_host_ms": d["host_s"] * 1e3,
            "prefill_tokens": p["tokens"], "prefill_tok_s": p["tokens"] / max(p["device_s"], p["host_s"]),
            "prefill_tflops": p["flops"] / max(p["device_s"], p["host_s"]) / 1e12,
            "batched_tok_s": {n: n / max(steps[f"step{n}"]["device_s"], steps[f"step{n}"]["host_s"]) for n in sequences},
            "batched_device_ms": {n: steps[f"step{n}"]["device_s"] * 1e3 for n in sequences}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--sequences", default="", help="batched steps of these many sequences, e.g. 1,4,16")
    ap.add_argument("--shapes", default=",".join(ORDER), help="of " + ", ".join(ORDER))
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--no-graphs", action="store_true", help="the decode step launch by launch, not as a CUDA graph")
    ap.add_argument("--activations", default="auto", choices=("auto", "8"),
                    help="8: every linear's input rounded to 8 bits where the preset rounds (h100: the dp4a GEMV)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    seqs = tuple(int(x) for x in args.sequences.split(",") if x)
    t0 = time.time()
    out = [predict_shape(s, p, args.context, args.prefill, seqs, not args.no_graphs, args.activations)
           for s in args.shapes.split(",") for p in args.presets.split(",")]
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(f"predicted by deploycc/perfmodel.py, q4f16_1, decode after {args.context} tokens, prefill of "
          f"{args.prefill} ({time.time() - t0:.0f} s)")
    print(f"{'shape':22s} {'preset':8s} {'decode tok/s':>12s} {'% roofline':>10s} {'roofline':>9s} {'launches':>8s} "
          f"{'bound':>6s} {'device ms':>9s} {'host ms':>8s} {'prefill tok/s':>13s} {'TFLOP/s':>8s}")
    for r in out:
        print(f"{r['shape']:22s} {r['preset']:8s} {r['decode_tok_s']:12.0f} {100 * r['decode_roofline_fraction']:9.1f}% "
              f"{r['roofline_tok_s']:9.0f} {r['decode_launches']:8d} {r['decode_bound']:>6s} "
              f"{r['decode_device_ms']:9.2f} {r['decode_host_ms']:8.2f} {r['prefill_tok_s']:13.0f} "
              f"{r['prefill_tflops']:8.1f}")
    if seqs:
        print(f"\nbatched step (the server's), aggregate tok/s / device ms per step, after {args.context} tokens each")
        print(f"{'shape':22s} {'preset':8s} " + " ".join(f"{f'{b} seq':>16s}" for b in seqs))
        for r in out:
            print(f"{r['shape']:22s} {r['preset']:8s} " + " ".join(
                f"{r['batched_tok_s'][b]:9.0f} / {r['batched_device_ms'][b]:4.2f}" for b in seqs))


if __name__ == "__main__":
    main()
