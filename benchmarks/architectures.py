"""deploycc vs llama.cpp on the shapes of today's small models (Qwen3-0.6B, Qwen2.5-0.5B, Gemma-3-1B,
Llama-3.2-1B): prefill and decode speed on this machine's CPU, one table.

    .venv/bin/python benchmarks/architectures.py [--models qwen3-0.6b,gemma3-1b] [--threads 2]
                                                 [--prompt-lens 128] [--gen 64] [--repeat 2] [--json]

No real weights of these models are reachable here, so each is a random-weight checkpoint of the real
shape (layers, widths, heads, vocabulary, tied head, windows), made with transformers into
$DEPLOYCC_HOME/bench/arch/. Speed does not depend on the values. llama.cpp gets the same checkpoint as
a GGUF written with llama.cpp's tensor names (F16), re-quantized to Q4_0 by llama.cpp's own
llama_model_quantize (which keeps its usual higher-precision output/embedding types); deploycc compiles
it for `cpu` as q4f16_2 with an 8-bit head. Both run the same random token ids, in fresh processes
(benchmarks/bench_workers.py), llama.cpp in the llama-cpp-python venv of benchmarks/compare.py.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import (  # noqa: E402
    deploycc_cli,
    ensure_llama_venv,
    load_fetch_script,
    log,
    machine_info,
    measure_bandwidth,
    run_logged,
    run_worker,
)

# The real models' shapes (their config.json), with random weights.
MODELS = {
    "qwen3-0.6b": ("qwen3", dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True,
                                 max_position_embeddings=40960, rope_theta=1000000.0)),
    "qwen2.5-0.5b": ("qwen2", dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                   num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True,
                                   max_position_embeddings=32768, rope_theta=1000000.0)),
    "gemma3-1b": ("gemma3", dict(vocab_size=262144, hidden_size=1152, intermediate_size=6912, num_hidden_layers=26,
                                 num_attention_heads=4, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
                                 sliding_window=512, max_position_embeddings=32768,
                                 rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                                  "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}})),
    "llama3.2-1b": ("llama", dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                                  num_attention_heads=32, num_key_value_heads=8, head_dim=64, tie_word_embeddings=True,
                                  max_position_embeddings=131072, rope_theta=500000.0,
                                  rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})),
}
DEPLOYCC_ARGS = ["--quantization", "q4f16_2", "--head-quantization", "q8f16_0"]


def make_checkpoint(name: str, out: Path) -> Path:
    if (out / "config.json").exists():
        return out
    import torch
    import transformers as tf

    arch, kwargs = MODELS[name]
    cls = {"qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM), "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
           "gemma3": (tf.Gemma3TextConfig, tf.Gemma3ForCausalLM), "llama": (tf.LlamaConfig, tf.LlamaForCausalLM)}[arch]
    torch.manual_seed(0)
    model = cls[1](cls[0](**kwargs, pad_token_id=0, bos_token_id=1, eos_token_id=2)).to(torch.bfloat16)
    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(tmp)
    tmp.rename(out)
    return out


def write_gguf(name: str, hf_dir: Path, out: Path) -> Path:
    """The checkpoint as convert_hf_to_gguf.py writes it (F16; llama.cpp's names, Q/K permuted for Llama,
    Gemma's norms as 1 + w) with a placeholder vocabulary of the model's size."""
    if out.exists():
        return out
    import gguf

    from deploycc.hub import Weights  # reads bfloat16

    arch, kw = MODELS[name]
    cfg = json.loads((hf_dir / "config.json").read_text())
    weights = Weights(hf_dir)
    tensors = {n: weights.read(n) for n in weights.names()}
    layers, heads, kv = cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    names = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, arch.upper()), layers)
    tmp = out.with_name(out.name + ".tmp")
    w = gguf.GGUFWriter(str(tmp), arch)
    w.add_block_count(layers)
    w.add_context_length(min(cfg["max_position_embeddings"], 8192))
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
    params = cfg.get("rope_parameters") or {}
    w.add_rope_freq_base((params.get("full_attention") or params).get("rope_theta", cfg.get("rope_theta", 10000.0)))
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    if arch == "gemma3":
        w.add_sliding_window(cfg["sliding_window"])
    if arch == "llama" and kw.get("rope_scaling"):  # llama.cpp's Llama 3 rope: a rope_freqs tensor
        from deploycc.models._rope import inv_freq

        base = 1.0 / inv_freq(head_dim, kw["rope_theta"], None)[0]
        scaled = 1.0 / inv_freq(head_dim, kw["rope_theta"], dict(kw["rope_scaling"]))[0]
        tensors["rope_freqs.weight"] = (scaled / base).astype(np.float32)
    vocab = cfg["vocab_size"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(["a", "b", "ab"] + [f"<t{i}>" for i in range(3, vocab)])
    w.add_token_types([1] * vocab)
    w.add_token_merges(["a b"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    for hf_name, arr in tensors.items():
        if hf_name == "lm_head.weight" and cfg.get("tie_word_embeddings"):
            continue
        gname = "rope_freqs.weight" if hf_name == "rope_freqs.weight" else names.get_name(hf_name, (".weight", ".bias"))
        if gname is None:
            raise SystemExit(f"error: no GGUF name for {hf_name}")
        a = np.asarray(arr, np.float32)
        if arch == "llama" and gname.endswith(("attn_q.weight", "attn_k.weight")):
            n = heads if "attn_q" in gname else kv
            a = a.reshape(n, 2, a.shape[0] // n // 2, *a.shape[1:]).swapaxes(1, 2).reshape(a.shape)
        if arch == "gemma3" and hf_name.endswith("norm.weight"):
            a = a + 1.0
        w.add_tensor(gname, a.astype(np.float16) if a.ndim == 2 else a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.rename(out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS), type=lambda s: s.split(","))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-lens", type=lambda s: [int(x) for x in s.split(",")], default=[128])
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        raise SystemExit(f"error: unknown model {unknown[0]!r}; known: {', '.join(MODELS)}")
    t_start = time.perf_counter()
    bench = load_fetch_script().cache_home() / "bench"
    root = bench / "arch"
    root.mkdir(parents=True, exist_ok=True)
    llama_py = str(ensure_llama_venv(bench))
    bw = measure_bandwidth()
    rows = []
    for name in args.models:
        hf_dir = make_checkpoint(name, root / name)
        vocab = json.loads((hf_dir / "config.json").read_text())["vocab_size"]
        ids = [int(t) for t in np.random.default_rng(0).integers(3, vocab, max(args.prompt_lens) + 8)]
        ids_file = root / f"{name}.ids.json"
        ids_file.write_text(json.dumps({"ids": ids}))
        pkg = root / f"{name}-deploycc"
        if not (pkg / "manifest.json").exists():
            log(f"{name}: deploycc compile")
            rc, _, err = run_logged([*deploycc_cli(), "compile", str(hf_dir), "--device", "cpu", *DEPLOYCC_ARGS,
                                     "-o", str(pkg), "--force"], 1800)
            if rc:
                raise SystemExit(f"error: deploycc compile of {name} failed: {err.strip().splitlines()[-1:]}")
        f16 = write_gguf(name, hf_dir, root / f"{name}.F16.gguf")
        q4 = root / f"{name}.Q4_0.gguf"
        if not q4.exists():
            log(f"{name}: llama.cpp Q4_0")
            _, err = run_worker(llama_py, "llama-quantize", "speed", str(f16), "Q4_0", args, out=str(q4))
            if err:
                raise SystemExit(f"error: llama_model_quantize of {name}: {err}")
        for tool, python, model, label in (("deploycc", sys.executable, pkg, "q4f16_2 + 8-bit head"),
                                           ("llama.cpp", llama_py, q4, "Q4_0")):
            log(f"{name}: {tool} {label}")
            res, err = run_worker(python, tool, "speed", str(model), label, args, ids_file)
            row = {"model": name, "tool": tool, "format": label}
            if err:
                row["error"] = err
            else:
                row.update(prefill_tok_s=res["prefill_tok_s"], decode_tok_s=res["decode_tok_s"],
                           weights_bytes=res["weights_bytes"])
            rows.append(row)
    result = {"rows": rows, "bandwidth": bw, "machine": machine_info(), "threads": args.threads,
              "prompt_lens": args.prompt_lens, "gen": args.gen, "repeat": args.repeat,
              "elapsed_s": time.perf_counter() - t_start}
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"{result['machine'].get('cpu', '')}, {args.threads} threads; memory read {bw['read_gb_s']:.1f} GB/s")
    print(f"{'model':14} {'tool':10} {'format':22} {'weights MB':>10} "
          + " ".join(f"{'prefill@' + str(n):>12}" for n in args.prompt_lens) + f" {'decode':>8} {'decode GB/s':>11}")
    for r in rows:
        if "error" in r:
            print(f"{r['model']:14} {r['tool']:10} {r['format']:22} error: {r['error']}")
            continue
        mb = r["weights_bytes"] / 1e6
        print(f"{r['model']:14} {r['tool']:10} {r['format']:22} {mb:10.0f} "
              + " ".join(f"{r['prefill_tok_s'][str(n)]:12.1f}" for n in args.prompt_lens)
              + f" {r['decode_tok_s']:8.1f} {mb * r['decode_tok_s'] / 1e3:11.1f}")
    for name in args.models:
        ours = next((r for r in rows if r["model"] == name and r["tool"] == "deploycc" and "error" not in r), None)
        theirs = next((r for r in rows if r["model"] == name and r["tool"] == "llama.cpp" and "error" not in r), None)
        if ours and theirs:
            n = str(args.prompt_lens[0])
            print(f"{name}: deploycc / llama.cpp: prefill {ours['prefill_tok_s'][n] / theirs['prefill_tok_s'][n]:.2f}x, "
                  f"decode {ours['decode_tok_s'] / theirs['decode_tok_s']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
